"""The direct MessageSet reader never reads a datum differently from fastavro, and does read the usual ones.

``decode_message_set`` tries ``read_message_set`` first and falls back to fastavro when it declines. For any
bytes (encodings of arbitrary field values, then flipped, cut or extended) the outcome must be the one of
the fastavro path alone: the same MessageSet or the same WireFormatError reason, which is what a dead letter
says.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transforms.trust.message_set as message_set_module
from schemas import WireFormatError, decode_record, encode_record, load_schema
from transforms.trust.message_set import SealedMessage, decode_message_set, decode_signed_set, signed_parts
from transforms.trust.message_set_reader import read_message_set

HEADER = load_schema("MessageSet").header
SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def record(**fields: Any) -> dict[str, Any]:
    base = {"schema_version": 1, "spec_id": "app@0123456789ab", "crowd_id": None, "device_id": "ab" * 16,
            "event_time": 1_700_000_000_000, "nonce": b"n" * 16, "key_id": "analyzer-1",
            "messages": [{"channel": 0, "sealed": b"s" * 90}], "signature": b"g" * 64}
    return {**base, **fields}


def encoded(fields: dict[str, Any]) -> bytes:
    return encode_record("MessageSet", fields, check=False)


def outcome(data: bytes) -> Any:
    try:
        return decode_message_set(data)
    except WireFormatError as err:
        return err.reason


def fastavro_outcome(data: bytes, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(message_set_module, "read_message_set", lambda data, message: None)
        return outcome(data)


INT64 = st.integers(-(2**63), 2**63 - 1)
records = st.builds(
    record, schema_version=st.one_of(st.just(1), st.integers(-(2**31), 2**31 - 1)),
    spec_id=st.text(max_size=70), crowd_id=st.one_of(st.none(), st.text(max_size=70)),
    device_id=st.one_of(st.text("0123456789abcdef", min_size=32, max_size=32), st.text(max_size=40)),
    event_time=INT64, nonce=st.binary(max_size=70), key_id=st.text(max_size=70),
    messages=st.lists(st.fixed_dictionaries({"channel": st.integers(-(2**31), 2**31 - 1),
                                             "sealed": st.binary(max_size=300)}), max_size=4),
    signature=st.one_of(st.binary(min_size=64, max_size=64), st.binary(max_size=100)))


def edits(data: bytes, draw: st.DrawFn) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(out) - 1))
        out[i] ^= draw(st.integers(1, 255))
    cut = draw(st.one_of(st.none(), st.integers(0, len(out))))
    return bytes(out[:cut]) + draw(st.one_of(st.just(b""), st.binary(min_size=1, max_size=4)))


@st.composite
def datums(draw: st.DrawFn) -> bytes:
    data = encoded(draw(records))
    return data if draw(st.booleans()) else edits(data, draw)


@SETTINGS
@given(datums())
def test_the_reader_agrees_with_fastavro_or_declines(data: bytes) -> None:
    fields = read_message_set(data, SealedMessage)
    if fields is not None:
        r = decode_record("MessageSet", data)  # must not raise: the reader accepted it
        assert fields == (r["spec_id"], r["crowd_id"], r["device_id"], r["event_time"], r["nonce"], r["key_id"],
                          [SealedMessage(m["channel"], m["sealed"]) for m in r["messages"]], r["signature"])


@SETTINGS
@given(st.one_of(datums(), st.binary(max_size=200).map(lambda b: HEADER + b)))
def test_decode_has_the_outcome_of_the_fastavro_path(data: bytes) -> None:
    with pytest.MonkeyPatch.context() as m:
        expected = fastavro_outcome(data, m)
    assert outcome(data) == expected


@SETTINGS
@given(st.one_of(datums(), st.binary(max_size=200).map(lambda b: HEADER + b)))
def test_the_shuffler_fast_path_reads_what_decode_and_signed_parts_read(data: bytes) -> None:
    """``decode_signed_set`` gives a set's fields, (channel, sealed) pairs, signature and signed bytes exactly as
    ``decode_message_set`` and ``signed_parts`` do, or declines: it never accepts what they refuse."""
    fast = decode_signed_set(data)
    if fast is None:
        return
    ms = decode_message_set(data)  # must not raise: the fast path accepted it
    assert fast == (ms.spec_id, ms.crowd_id, ms.device_id, ms.event_time_ms,
                    tuple((m.channel, m.sealed) for m in ms.messages), *signed_parts(ms))


def test_the_shuffler_fast_path_takes_the_usual_set_and_declines_what_the_checks_refuse() -> None:
    usual = encoded(record(messages=[{"channel": 0, "sealed": b"s" * 90}, {"channel": -1, "sealed": b"p"}]))
    ms = decode_message_set(usual)
    assert decode_signed_set(usual) == (ms.spec_id, None, "ab" * 16, ms.event_time_ms,
                                        ((0, b"s" * 90), (-1, b"p")), b"g" * 64, signed_parts(ms)[1])
    for refused in (record(device_id="AB" * 16), record(nonce=b"n" * 15), record(messages=[]),
                    record(messages=[{"channel": -2, "sealed": b"s"}]), record(signature=b"g" * 63),
                    record(event_time=-1), record(spec_id="")):
        data = encoded(refused)
        assert decode_signed_set(data) is None
        with pytest.raises(WireFormatError):
            decode_message_set(data)
    assert decode_signed_set(bytearray(usual)) is None  # not bytes: the reference path converts it


@SETTINGS
@given(records.filter(lambda r: r["schema_version"] == 1 and all(
    len(r[k].encode()) <= 63 for k in ("spec_id", "device_id", "key_id")) and len(r["nonce"]) <= 63
    and (r["crowd_id"] is None or len(r["crowd_id"].encode()) <= 63) and -(2**62) <= r["event_time"] < 2**62))
def test_the_reader_reads_every_usual_set_itself(fields: dict[str, Any]) -> None:
    """Not a fast path that declines everything: ids up to 63 bytes, messages up to 8191 and times whose
    zig-zag varint has at most 9 bytes are its own."""
    assert read_message_set(encoded(fields), SealedMessage) is not None


def test_a_sealed_message_past_two_length_bytes_is_left_to_fastavro() -> None:
    data = encoded(record(messages=[{"channel": 1, "sealed": b"x" * 8192}]))
    assert read_message_set(data, SealedMessage) is None
    assert decode_record("MessageSet", data)["messages"] == [{"channel": 1, "sealed": b"x" * 8192}]


@pytest.mark.parametrize("name, data", [
    ("overlong version", HEADER + b"\x82\x00" + encoded(record())[len(HEADER) + 1:]),
    ("ten-byte event time", encoded(record(event_time=0)).replace(
        b"\x00\x20nnnn", b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00\x20nnnn", 1)),
    ("union index 2", encoded(record(crowd_id="c")).replace(b"ab\x02\x02c", b"ab\x04\x02c", 1)),
    ("negative length", encoded(record(spec_id="")).replace(b"\x02\x00\x00\x40", b"\x02\x01\x00\x40", 1)),
    ("negative block count", encoded(record()).replace(b"\x14analyzer-1\x02\x00", b"\x14analyzer-1\x01\x00\x00", 1)),
    ("negative sealed length", encoded(record(messages=[{"channel": 0, "sealed": b""}])).replace(
        b"\x02\x00\x00\x00\x80\x01", b"\x02\x00\x01\x00\x80\x01", 1)),
    ("trailing byte", encoded(record()) + b"\x00"),
    ("truncated", encoded(record())[:-1]),
    ("unknown schema", HEADER[:2] + b"\x00" * 8 + encoded(record())[len(HEADER):]),
])
def test_odd_encodings_are_declined_and_judged_by_fastavro(name: str, data: bytes,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert data != encoded(record()) and read_message_set(data, SealedMessage) is None, name
    assert outcome(data) == fastavro_outcome(data, monkeypatch), name
