"""PackedSets (transforms/shuffler/packed_sets.py): the shuffler's columnar batch of authenticated message sets.

What must hold: packing loses nothing the shuffler uses (iterating gives the sets back, digest cut to its
16-byte prefix), pickling is compact and versioned, joining batches remaps their Kafka sources, and the
arrival order is the one dedupe has always used: device, event time, then (topic, partition, offset).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from transforms.shuffler.elements import SetElement
from transforms.shuffler.packed import PackedMessages
from transforms.shuffler.packed_sets import DIGEST_BYTES, PackedSets
from transforms.wire.elements import SourceRef

SPEC_ID, WINDOW_END = "spec@0123456789ab", 7_200_000


def random_sets(rng: np.random.Generator, n: int, devices: int = 5, width: int = 87) -> list[SetElement]:
    """``n`` sets of ``devices`` devices over two topics and three partitions, 1-3 messages each."""
    ids = [rng.bytes(16).hex() for _ in range(devices)]
    out = []
    for _ in range(n):
        messages = tuple((int(c), rng.bytes(width)) for c in rng.integers(-1, 4, size=int(rng.integers(1, 4))))
        source = SourceRef(str(rng.choice(["reports", "reports-b"])), int(rng.integers(0, 3)), int(rng.integers(0, 50)))
        out.append(SetElement(SPEC_ID, None, ids[int(rng.integers(devices))], int(rng.integers(0, 5)), WINDOW_END,
                              rng.bytes(32), messages, source))
    return out


def test_packing_keeps_every_field_and_pickles_compactly() -> None:
    rng = np.random.default_rng(1)
    items = random_sets(rng, 40)
    packed = PackedSets.of(SPEC_ID, None, WINDOW_END, items)
    expected = [i._replace(digest=i.digest[:DIGEST_BYTES]) for i in items]
    assert list(packed) == expected and len(packed) == 40
    assert list(pickle.loads(pickle.dumps(packed))) == expected
    # One message of 87 bytes per set: payload + 56 bytes of set columns (device 16, digest 16, event time 8,
    # offset 8, source 4, count 4) + 12 of message columns (channel 4, offset 8), plus a fixed header.
    single = PackedSets.of(SPEC_ID, None, WINDOW_END, [i._replace(messages=i.messages[:1]) for i in items * 50])
    assert len(pickle.dumps(single)) <= len(single) * (87 + 56 + 12) + 1000


def test_an_unknown_version_and_inconsistent_columns_are_refused() -> None:
    packed = PackedSets.of(SPEC_ID, None, WINDOW_END, random_sets(np.random.default_rng(2), 3))
    blob = pickle.dumps(packed)
    with pytest.raises(ValueError, match="version 9"):
        pickle.loads(blob.replace(b"\x4b\x01", b"\x4b\x09", 1))
    with pytest.raises(ValueError, match="add up"):
        PackedSets(SPEC_ID, None, WINDOW_END, devices=packed.devices, event_ms=packed.event_ms,
                   digests=packed.digests, sources=packed.sources, source_index=packed.source_index,
                   offsets=packed.offsets, n_messages=packed.n_messages + 1, messages=packed.messages)
    with pytest.raises(ValueError, match="outside the sources"):
        PackedSets(SPEC_ID, None, WINDOW_END, devices=packed.devices, event_ms=packed.event_ms,
                   digests=packed.digests, sources=packed.sources[:0], source_index=packed.source_index,
                   offsets=packed.offsets, n_messages=packed.n_messages, messages=packed.messages)


def test_concat_remaps_sources_and_refuses_other_windows() -> None:
    rng = np.random.default_rng(3)
    a, b = random_sets(rng, 17), random_sets(rng, 23)
    joined = PackedSets.concat([PackedSets.of(SPEC_ID, None, WINDOW_END, part) for part in (a, b)])
    assert [s.source for s in joined] == [s.source for s in a + b]
    assert [s.messages for s in joined] == [s.messages for s in a + b]
    assert len(joined.sources) == len({(s.source.topic, s.source.partition) for s in a + b})
    other = PackedSets.of(SPEC_ID, None, WINDOW_END + 1, a)
    with pytest.raises(ValueError, match="different"):
        PackedSets.concat([joined, other])


def test_arrival_order_is_device_then_event_time_then_kafka_position() -> None:
    rng = np.random.default_rng(4)
    items = random_sets(rng, 300, devices=7)
    packed = PackedSets.concat([PackedSets.of(SPEC_ID, None, WINDOW_END, items[i:i + 50]) for i in range(0, 300, 50)])
    expected = sorted(range(300), key=lambda i: (items[i].device_id, items[i].event_time_ms, tuple(items[i].source),
                                                  i))
    assert packed.arrival_order().tolist() == expected


def test_message_rows_select_the_messages_of_given_sets_in_order() -> None:
    items = random_sets(np.random.default_rng(5), 30)
    packed = PackedSets.of(SPEC_ID, None, WINDOW_END, items)
    rows = np.array([29, 3, 3, 0, 17])
    picked = packed.messages.take(packed.message_rows(rows))
    assert list(picked) == [m for r in rows for m in items[r].messages]
    assert packed.message_rows(np.zeros(0, np.int64)).size == 0
    assert isinstance(picked, PackedMessages)


def columns(p: PackedSets) -> list:
    return [p.spec_id, p.crowd_id, p.window_end_ms, p.sources, p.messages.payload,
            *((a.dtype.str, a.shape, a.tobytes()) for a in (p.devices, p.event_ms, p.digests, p.source_index,
                                                           p.offsets, p.n_messages, p.messages.channels,
                                                           p.messages.offsets))]


@pytest.mark.parametrize("n", [0, 1, 7, 60])
def test_of_builds_exactly_what_the_checked_constructor_builds(n: int) -> None:
    """``of`` skips __init__'s checks (its columns are consistent by construction): the same pack, column for
    column, as one rebuilt through __init__ (which unpickling does)."""
    items = random_sets(np.random.default_rng(10 + n), n)
    packed = PackedSets.of(SPEC_ID, "crowd", WINDOW_END, items)
    rebuilt = PackedSets(SPEC_ID, "crowd", WINDOW_END, devices=packed.devices, event_ms=packed.event_ms,
                         digests=packed.digests, sources=packed.sources, source_index=packed.source_index,
                         offsets=packed.offsets, n_messages=packed.n_messages, messages=packed.messages)
    assert columns(packed) == columns(rebuilt) == columns(pickle.loads(pickle.dumps(packed)))
    assert list(packed) == [i._replace(crowd_id="crowd", digest=i.digest[:DIGEST_BYTES]) for i in items]


def test_of_refuses_device_ids_and_digests_it_cannot_pack() -> None:
    items = random_sets(np.random.default_rng(3), 3)
    # 31 and 33 digits: joined they are whole bytes, one by one they are not
    shifted = [items[0]._replace(device_id=items[0].device_id[:-1]),
               items[1]._replace(device_id="a" + items[1].device_id)]
    with pytest.raises(ValueError, match="32 hex digits"):
        PackedSets.of(SPEC_ID, None, WINDOW_END, shifted)
    with pytest.raises(ValueError, match="shorter than 16 bytes"):
        PackedSets.of(SPEC_ID, None, WINDOW_END, [items[0], items[1]._replace(digest=b"short")])
