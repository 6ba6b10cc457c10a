"""Packed messages and units: the same contents as tuples, compact, canonical whatever the grouping."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from transforms.shuffler.graph import ReleaseFn, ScaleOut
from transforms.shuffler.packed import PackedMessages, PackedUnits
from transforms.spec import spec_from_dict

RNG_SEED = 21


def random_messages(rng: np.random.Generator, n: int, width: int | None) -> list[tuple[int, bytes]]:
    return [(int(rng.integers(-1, 9)), rng.bytes(width if width is not None else int(rng.integers(0, 40))))
            for _ in range(n)]


@pytest.mark.parametrize("width", [48, None])
def test_packed_messages_read_as_the_tuples_they_pack(width: int | None) -> None:
    rng = np.random.default_rng(RNG_SEED)
    messages = random_messages(rng, 500, width)
    packed = PackedMessages.of(messages)
    assert len(packed) == 500 and list(packed) == messages and packed == tuple(messages) and packed == messages
    assert packed[7] == messages[7] and packed[-1] == messages[-1] and list(packed[10:20]) == messages[10:20]
    assert packed.width() == width
    idx = rng.permutation(500)[:321]
    assert list(packed.take(idx)) == [messages[i] for i in idx]
    assert list(PackedMessages.concat([packed, packed.take(idx)])) == messages + [messages[i] for i in idx]
    restored = pickle.loads(pickle.dumps(packed))
    assert restored == packed and list(restored) == messages
    # compact: payload plus 12 bytes a message (and a small header), far below a tuple per message
    assert len(pickle.dumps(packed)) < sum(len(s) for _, s in messages) + 12 * 500 + 400
    with pytest.raises(IndexError):
        packed[500]


def test_packed_messages_are_validated() -> None:
    with pytest.raises(ValueError, match="offsets"):
        PackedMessages(np.zeros(2, np.int32), np.array([0, 5, 3]), b"abc")
    with pytest.raises(ValueError, match="n \\+ 1 offsets"):
        PackedMessages(np.zeros(2, np.int32), np.array([0, 3]), b"abc")
    blob = pickle.dumps(PackedMessages.of([(0, b"ab")])).replace(b"\x4b\x01", b"\x4b\x07", 1)  # version 1 -> 7
    with pytest.raises(ValueError, match="version 7"):
        pickle.loads(blob)


def test_units_gather_their_messages_and_take_rank_order_whatever_the_split() -> None:
    rng = np.random.default_rng(RNG_SEED)
    units = [(int(rng.integers(1, 3)), tuple(random_messages(rng, int(rng.integers(1, 5)), 32))) for _ in range(300)]
    ranks = rng.integers(0, 2**63, size=300).tolist()
    whole = PackedUnits.of(units, ranks)
    chosen = rng.permutation(300)[:200]
    assert list(whole.messages.take(whole.messages_of(chosen))) == [m for i in chosen for m in units[i][1]]
    canonical = [units[i] for i in np.argsort(ranks, kind="stable")]
    for cuts in ([100, 200], [1, 299], [150]):  # the same units bucketed three ways, groups in any order
        packs = [PackedUnits.of(units[a:b], ranks[a:b]) for a, b in zip([0, *cuts], [*cuts, 300], strict=True)]
        assert list(PackedUnits.concat(packs[::-1])) == canonical
    assert list(pickle.loads(pickle.dumps(whole))) == units
    with pytest.raises(ValueError, match="add up"):
        PackedUnits(np.array([1]), np.array([2]), PackedMessages.of([(0, b"a")]))


def test_a_release_does_not_depend_on_how_devices_were_bucketed() -> None:
    spec = spec_from_dict({"analysis": {"name": "packed", "metric": "packed"}, "domain": {"size": 8},
                           "mechanism": {"name": "grr", "epsilon": 2.0}, "window": {"size_seconds": 3600}},
                          source="test")
    rng = np.random.default_rng(RNG_SEED)
    units = [(1, ((0, rng.bytes(24)),)) for _ in range(400)]
    ranks = rng.integers(0, 2**63, size=400).tolist()
    crowd = ((spec.spec_id, None, 3_600_000), 3)
    fn = ReleaseFn([spec], b"k" * 16)
    outputs = []
    for cuts in ([50, 300], [399]):
        packs = [PackedUnits.of(units[a:b], ranks[a:b]) for a, b in zip([0, *cuts], [*cuts, 400], strict=True)]
        (part,) = fn.process((crowd, {"sets": packs[::-1], "decision": [37]}))
        outputs.append(part)
    assert outputs[0] == outputs[1] and outputs[0].n_sets == 363 and len(outputs[0].messages) == 363


def test_scale_out_grows_with_the_run_in_powers_of_two_within_bounds() -> None:
    spec = spec_from_dict({"analysis": {"name": "s", "metric": "s"}, "domain": {"size": 8},
                           "mechanism": {"name": "grr", "epsilon": 2.0}, "crowd": {"subkeys": 16}}, source="test")
    assert (ScaleOut(0).buckets, ScaleOut(0).subkeys(spec)) == (1, 16)  # small runs: one bucket
    assert (ScaleOut(100_000).buckets, ScaleOut(100_000).subkeys(spec)) == (8, 16)
    assert (ScaleOut(1_000_000).buckets, ScaleOut(1_000_000).subkeys(spec)) == (64, 16)
    assert (ScaleOut(10_000_000).buckets, ScaleOut(10_000_000).subkeys(spec)) == (512, 64)
    assert (ScaleOut(10**12).buckets, ScaleOut(10**12).subkeys(spec)) == (65_536, 4096)
    sizes = [ScaleOut(n) for n in np.geomspace(1, 1e11, 60).astype(int)]
    for a, b in itertools.pairwise(sizes):
        assert a.buckets <= b.buckets and a.subkeys(spec) <= b.subkeys(spec)
    assert all(s.buckets & (s.buckets - 1) == 0 and s.subkeys(spec) & (s.subkeys(spec) - 1) == 0 for s in sizes)
