"""The vectorized payload codec: ``encode_payloads`` writes, row for row, the bytes ``encode_payload`` writes, for
every registered mechanism and any row its wire dtype can hold; ``decode_canonical`` vouches only for plaintexts
that are exactly the canonical encoding of what it decoded, so ``decode_payloads`` gives every plaintext, honest
or hostile, the verdict ``decode_payload`` gives it alone; and honest batches never take the per-row path."""

from __future__ import annotations

import tomllib
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transforms.wire.payload_batch as payload_batch
import transforms.wire.payload_codec as payload_codec
from pipelines.demo.population import avro_value, synthesize
from pipelines.examples import example_names, example_path
from tests.transforms.payload_helpers import one_by_one
from transforms.device.wire import EventRows, _plaintexts
from transforms.mechanisms.base import channel_count, encode_messages, is_single_message
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.registry import MECHANISMS
from transforms.spec import AnalysisSpec, load_spec, spec_from_dict
from transforms.wire.avro_payload import decode_payload, encode_payload, payload_pad_length
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.payload_batch import decode_payloads
from transforms.wire.payload_codec import decode_canonical, encode_payloads, is_vectorized
from transforms.wire.rows import CHANNEL, PRESENCE, array_to_rows, client_messages, row_channel, wire_dtype

BASE = {"histogram": "app_language", "kv_mean": "feature_usage", "vector_mean": "sensor_vector",
        "range": "latency_range", "heavy_hitters": "url_heavy_hitters"}
EXTRA = {"mm_countmin": {"n_expected": 20000}, "mm_hadamard": {"n_expected": 20000}, "mm_range": {"n_expected": 2000},
         "vector_sum": {"n": 50000}}
# Every registered mechanism (from its example if there is one), plus unary encodings whose bit vector does
# not fill its last byte.
CASES = [*MECHANISMS, "oue/10", "cms/10", "pckv-ue/5"]
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


@cache
def _spec(case: str) -> AnalysisSpec:
    name, _, d = case.partition("/")
    for example in example_names():
        raw = tomllib.loads(example_path(example).read_text(encoding="utf-8"))
        if raw["mechanism"]["name"] == name and not d:
            return load_spec(example_path(example))
    raw = tomllib.loads(example_path(BASE[MECHANISMS[name].kinds[0]]).read_text(encoding="utf-8"))
    raw["mechanism"] = {"name": name, "epsilon": raw["mechanism"]["epsilon"], **EXTRA.get(name, {})}
    if d:
        table = "categories" if "categories" in raw["domain"] else "keys"
        raw["domain"][table] = [f"v{i}" for i in range(int(d))]
    return spec_from_dict(raw)


@cache
def _honest(case: str, clients: int = 4, keep: int = 40) -> np.ndarray:
    """Wire rows of a few simulated clients (presence markers included), at most ``keep`` of them."""
    spec = _spec(case)
    mechanism, rng = spec.randomizer, seeded_rng(5)
    values = [event_value(spec, avro_value(spec, v)) for v in synthesize(spec, clients, seed=3).values]
    wire, _ = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, values, rng), rng),
                              n_clients=clients)
    return wire if len(wire) <= keep else wire[np.sort(rng.choice(len(wire), keep, replace=False))]


def _column(sub: np.dtype, draw: Any, n: int) -> list[Any]:
    """n arbitrary values of one field: integers over the dtype's whole range, any double, any bytes."""
    size = int(np.prod(sub.shape)) if sub.shape else 1
    base = sub.base
    if base.kind in "iu":
        info = np.iinfo(base)
        items = st.one_of(st.sampled_from([int(info.min), int(info.max), 0, -1 if info.min < 0 else 1]),
                          st.integers(int(info.min), int(info.max)))
    else:
        items = st.floats(allow_nan=True, allow_infinity=True)
    return [draw(st.lists(items, min_size=size, max_size=size)) for _ in range(n)]


def _arbitrary_rows(mechanism: Any, draw: Any) -> np.ndarray:
    dtype = wire_dtype(mechanism)
    n = draw(st.integers(0, 6))
    rows = np.zeros(n, dtype=dtype)
    for name in dtype.names:
        sub = dtype.fields[name][0]
        if name == CHANNEL:
            rows[name] = draw(st.lists(st.sampled_from([PRESENCE, 0, 1, 2**63 - 1, -2**63]), min_size=n, max_size=n))
        else:
            rows[name] = np.asarray(_column(sub, draw, n), dtype=sub.base).reshape(rows[name].shape)
    return rows


def _extremes(mechanism: Any) -> np.ndarray:
    """Rows with every field at its dtype's bounds (int64 min/max where the dtype allows), inf, nan, -0.0."""
    dtype = wire_dtype(mechanism)
    rows = np.zeros(6, dtype=dtype)
    for name in dtype.names:
        base = dtype.fields[name][0].base
        if name == CHANNEL:
            rows[name] = [0, 0, 0, 0, PRESENCE, 1] if not is_single_message(mechanism) else 0
        elif base.kind in "iu":
            info = np.iinfo(base)
            rows[name] = np.array([info.min, info.max, 0, info.max // 2, info.min + 1, 127], dtype=base)[
                (slice(None),) + (None,) * (rows[name].ndim - 1)]
        else:
            rows[name] = np.array([-np.inf, np.inf, np.nan, -0.0, 1e308, 5e-324])[
                (slice(None),) + (None,) * (rows[name].ndim - 1)]
    return rows


def _per_row(mechanism: Any, rows: np.ndarray) -> list[bytes]:
    return [encode_payload(mechanism, row) for row in array_to_rows(rows)] if len(rows) else []


@pytest.mark.parametrize("case", CASES)
def test_every_mechanism_is_vectorized_and_encodes_its_rows_as_fastavro_does(case: str) -> None:
    mechanism = _spec(case).randomizer
    assert is_vectorized(mechanism)
    for rows in (_honest(case), _extremes(mechanism)):
        got = encode_payloads(mechanism, rows)
        assert got.shape == (len(rows), 2 + payload_pad_length(mechanism))
        assert [bytes(r) for r in got] == _per_row(mechanism, rows)


@pytest.mark.parametrize("case", CASES)
@SETTINGS
@given(data=st.data())
def test_arbitrary_rows_encode_as_fastavro_does(case: str, data: st.DataObject) -> None:
    mechanism = _spec(case).randomizer
    rows = _arbitrary_rows(mechanism, data.draw)
    assert [bytes(r) for r in encode_payloads(mechanism, rows)] == _per_row(mechanism, rows)


MUTATIONS = ["flip", "truncate", "extend", "overlong", "branch", "padding", "prefix", "random", "channel"]


def _mutate(data: bytes, channel: int, kind: str, draw: Any, channels: int) -> tuple[bytes, int]:
    """A hostile variant of a canonical plaintext: damaged, or well-formed for fastavro but not canonical."""
    width, size = len(data), int.from_bytes(data[:2], "big")
    out = bytearray(data)
    if kind == "flip":
        out[draw(st.integers(0, width - 1))] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        del out[draw(st.integers(0, width - 1)):]
    elif kind == "extend":
        out.append(draw(st.integers(0, 255)))
    elif kind == "overlong":  # a varint's last byte gains a continuation and a 0x00 group: the same value
        at = draw(st.integers(2, 1 + size))
        if out[at] < 0x80:
            out[at] |= 0x80
            out.insert(at + 1, 0)
            out[:2] = (size + 1).to_bytes(2, "big")
            if size + 1 < width - 2:
                out.pop()
    elif kind == "branch":
        out[2] = 2 * draw(st.integers(0, 9))
    elif kind == "padding" and size < width - 2:
        out[draw(st.integers(2 + size, width - 1))] = draw(st.integers(1, 255))
    elif kind == "prefix":
        out[:2] = max(0, size + draw(st.sampled_from([-1, 1]))).to_bytes(2, "big")
    elif kind == "random":
        out = bytearray(draw(st.binary(min_size=width, max_size=width)))
    elif kind == "channel":
        channel = draw(st.sampled_from([PRESENCE, -2, 0, 1, channels - 1, channels, 10**6, 2**63]))
    return bytes(out), channel


def _verdicts(mechanism: Any, plaintexts: list[bytes], channels: list[int]) -> list[Any]:
    rows, kept, failures = decode_payloads(mechanism, plaintexts, channels)
    verdicts: list[Any] = [None] * len(plaintexts)
    for i, row in zip(kept, rows, strict=True):
        verdicts[i] = row
    for i, reason in failures:
        assert verdicts[i] is None
        verdicts[i] = reason
    return verdicts


def _assert_only_canonical(mechanism: Any, plaintexts: list[bytes], channels: list[int]) -> np.ndarray:
    """The fast path's accepted rows are exactly fastavro's encoding of their row, on a channel that exists."""
    index, rows = decode_canonical(mechanism, plaintexts, channels)
    for i, row in zip(index.tolist(), array_to_rows(rows), strict=True):
        assert plaintexts[i] == encode_payload(mechanism, row)
        assert row_channel(mechanism, row) == channels[i]
        assert channels[i] == PRESENCE or 0 <= channels[i] < channel_count(mechanism)
    return index


@pytest.mark.parametrize("case", CASES)
@SETTINGS
@given(data=st.data())
def test_hostile_batches_get_the_one_by_one_verdicts(case: str, data: st.DataObject) -> None:
    mechanism = _spec(case).randomizer
    honest = array_to_rows(_honest(case))
    plaintexts = [encode_payload(mechanism, r) for r in honest]
    channels = [row_channel(mechanism, r) for r in honest]
    for _ in range(data.draw(st.integers(1, 12))):
        j = data.draw(st.integers(0, len(honest) - 1))
        kind = data.draw(st.sampled_from(MUTATIONS))
        text, channel = _mutate(plaintexts[j], channels[j], kind, data.draw, channel_count(mechanism))
        plaintexts.append(text)
        channels.append(channel)
    accepted = _assert_only_canonical(mechanism, plaintexts, channels)
    assert set(range(len(honest))) <= set(accepted.tolist())  # every honest plaintext takes the fast path
    assert repr(_verdicts(mechanism, plaintexts, channels)) == repr(one_by_one(mechanism, plaintexts, channels))


@pytest.mark.parametrize("case", ["olh", "mm_hadamard", "rappor", "privkv", "vector_sum", "oue/10"])
def test_noncanonical_payloads_fastavro_accepts_take_the_per_row_path(case: str) -> None:
    """An overlong union index (0x80|b, 0x00) and a prefix that leaves the last payload byte in the padding
    decode per row (fastavro reads them); the fast path must not vouch for them, and the verdict is fastavro's."""
    mechanism = _spec(case).randomizer
    row = next(r for r in array_to_rows(_honest(case)) if row_channel(mechanism, r) != PRESENCE)
    channel, canonical = row_channel(mechanism, row), encode_payload(mechanism, row)
    size = int.from_bytes(canonical[:2], "big")
    overlong = (size + 1).to_bytes(2, "big") + bytes([canonical[2] | 0x80, 0]) + canonical[3:-1]
    assert decode_payload(mechanism, overlong, channel) == row
    plaintexts, channels = [canonical, overlong], [channel, channel]
    assert _assert_only_canonical(mechanism, plaintexts, channels).tolist() == [0]
    assert repr(_verdicts(mechanism, plaintexts, channels)) == repr(one_by_one(mechanism, plaintexts, channels))


@pytest.mark.parametrize("example", example_names())
def test_honest_batches_never_take_the_per_row_path(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return decode_payload(*args, **kwargs)

    monkeypatch.setattr(payload_batch, "decode_payload", counting)
    spec = load_spec(example_path(example))
    mechanism, rng = spec.randomizer, seeded_rng(9)
    clients = 1000 if is_single_message(mechanism) else 20
    values = [event_value(spec, avro_value(spec, v)) for v in synthesize(spec, clients, seed=4).values]
    wire, _ = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, values, rng), rng),
                              n_clients=clients)
    plaintexts = [bytes(r) for r in encode_payloads(mechanism, wire)]
    channels = wire[CHANNEL].tolist() if CHANNEL in wire.dtype.names else [0] * len(wire)
    rows, kept, failures = decode_payloads(mechanism, plaintexts, channels)
    assert not failures and kept == list(range(len(wire)))
    assert calls == []
    assert rows == array_to_rows(wire)
    monkeypatch.setattr(payload_batch, "decode_canonical", lambda m, p, c: (np.zeros(0, np.int64), wire[:0]))
    assert decode_payloads(mechanism, plaintexts[:50], channels[:50])[0] == array_to_rows(wire[:50])
    assert len(calls) == min(50, len(wire))  # the counter counts: the per-row path, forced, is seen


def test_device_wire_encodes_mixed_batches_per_mechanism_with_the_same_bytes() -> None:
    """``wire._plaintexts`` groups rows per mechanism (one vectorized call each) and keeps the row order."""
    olh, grid = load_spec(example_path("app_language")), load_spec(example_path("grid"))
    events = []
    for k in range(40):
        spec = olh if k % 3 else grid
        case = "olh" if k % 3 else "rappor"
        rows = array_to_rows(_honest(case))[k % 5: k % 5 + 1 + k % 4]
        events.append(EventRows(spec, rows, 0, None, "device", None, b"", None))  # type: ignore[arg-type]
    want = [encode_payload(e.spec.randomizer, r) for e in events for r in e.rows]
    assert _plaintexts(events) == want
    assert _plaintexts(events[:1]) == want[:len(events[0].rows)]  # below the vectorizing threshold
    # The edge encoder's rows: slices of the wire arrays themselves (never turned into tuples), the same bytes.
    arrays = [e._replace(rows=_honest("olh" if k % 3 else "rappor")[k % 5: k % 5 + 1 + k % 4])
              for k, e in enumerate(events)]
    assert _plaintexts(arrays) == want
    assert _plaintexts(arrays[:1]) == want[:len(events[0].rows)]
    same = [e for e in arrays if e.spec is olh]  # the encoder hands over one spec's batch already stacked
    assert _plaintexts(same, np.concatenate([e.rows for e in same])) == _plaintexts(same)


@pytest.mark.parametrize("case", ["mm_hadamard", "olh"])
def test_batches_without_a_usable_payload_decode_to_nothing(case: str) -> None:
    mechanism = _spec(case).randomizer
    width = 2 + payload_pad_length(mechanism)
    rows, kept, failures = decode_payloads(mechanism, [b"\xff\xff", bytes(width)], [0, 0])
    assert rows == [] and kept == [] and [i for i, _ in failures] == [0, 1]
    assert decode_payloads(mechanism, [], []) == ([], [], [])


@pytest.mark.parametrize("case", ["olh", "mm_hadamard"])
def test_a_validate_that_refuses_the_batch_falls_back_to_per_row_checks(case: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """If the mechanism's ``validate`` raises on the stacked batch, every row is checked alone (as before)."""
    mechanism = _spec(case).randomizer
    original = type(mechanism).validate

    def picky(self: Any, reports: np.ndarray) -> np.ndarray:
        if len(reports) > 1:
            raise ValueError("cannot check a batch")
        return original(self, reports)

    monkeypatch.setattr(type(mechanism), "validate", picky)
    rows = array_to_rows(_honest(case))
    plaintexts = [encode_payload(mechanism, r) for r in rows]
    channels = [row_channel(mechanism, r) for r in rows]
    got = _verdicts(mechanism, plaintexts, channels)
    assert repr(got) == repr(one_by_one(mechanism, plaintexts, channels))
    assert all(isinstance(v, tuple) for v in got)


@pytest.mark.parametrize("case", ["olh", "mm_hadamard"])
def test_a_mechanism_without_a_layout_uses_the_per_row_functions(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback for a payload the codec does not lay out: per-row bytes, nothing vouched for, same verdicts."""
    mechanism = _spec(case).randomizer
    rows = _honest(case)
    monkeypatch.setattr(payload_codec, "_layouts", lambda m: None)
    assert not is_vectorized(mechanism)
    plaintexts = [bytes(r) for r in encode_payloads(mechanism, rows)]
    assert plaintexts == _per_row(mechanism, rows)
    channels = [row_channel(mechanism, r) for r in array_to_rows(rows)]
    assert len(decode_canonical(mechanism, plaintexts, channels)[0]) == 0
    assert repr(_verdicts(mechanism, plaintexts, channels)) == repr(one_by_one(mechanism, plaintexts, channels))
