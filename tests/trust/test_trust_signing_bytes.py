"""signing_bytes is what every device signs: its faster build must stay byte-identical to the original one.

The reference below is the implementation as it was before it was built in one join (canonical encoders, one
bytes object per field), copied here so that no later change to either can move both at once. Equal bytes for
every message set, and for fields of odd types (bool, bytearray, str subclasses, out-of-range integers,
unencodable text) the same exception type wherever the reference raises.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.trust.message_set import MessageSet, SealedMessage, messages_bytes, signing_bytes

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


def ref_blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + bytes(data)


def ref_text(value: str) -> bytes:
    return ref_blob(value.encode("utf-8"))


def ref_optional_text(value: str | None) -> bytes:
    return b"\x00" if value is None else b"\x01" + ref_text(value)


def ref_i64(value: int) -> bytes:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return _I64.pack(value)


def ref_messages_bytes(messages: tuple[SealedMessage, ...]) -> bytes:
    return ref_i64(len(messages)) + b"".join(ref_i64(m.channel) + ref_blob(m.sealed) for m in messages)


def ref_signing_bytes(ms: MessageSet) -> bytes:
    return ref_blob(b"esa-messageset-v1") + b"".join([
        ref_text(ms.spec_id), ref_optional_text(ms.crowd_id), ref_text(ms.device_id), ref_i64(ms.event_time_ms),
        ref_blob(ms.nonce), ref_text(ms.key_id), ref_messages_bytes(ms.messages)])


def same_outcome(fast, reference, *args) -> None:
    try:
        expected = reference(*args)
    except Exception as err:
        with pytest.raises(type(err)):
            fast(*args)
    else:
        assert fast(*args) == expected


class Channel(IntEnum):
    PRESENCE = -1
    FIRST = 0


class Name(str):
    pass


INT64 = st.integers(-(2**63), 2**63 - 1)
messages = st.lists(st.builds(SealedMessage, st.one_of(INT64, st.integers(-(2**70), 2**70)),
                              st.binary(max_size=40)), max_size=5).map(tuple)
message_sets = st.builds(
    MessageSet, st.text(max_size=30), st.one_of(st.none(), st.text(max_size=12)), st.text(max_size=40),
    st.one_of(INT64, st.integers(-(2**70), 2**70)), st.binary(max_size=24), st.text(max_size=20), messages,
    st.binary(max_size=64))


@settings(max_examples=500, deadline=None)
@given(message_sets)
def test_signing_bytes_equal_the_reference(ms: MessageSet) -> None:
    same_outcome(signing_bytes, ref_signing_bytes, ms)
    same_outcome(messages_bytes, ref_messages_bytes, ms.messages)


@settings(max_examples=200, deadline=None)
@given(st.builds(MessageSet, st.text(max_size=30), st.one_of(st.none(), st.text(max_size=12)),
                 st.text("0123456789abcdef", min_size=32, max_size=32), st.integers(0, 2**53 - 1),
                 st.binary(min_size=16, max_size=16), st.text(min_size=1, max_size=20),
                 st.lists(st.builds(SealedMessage, st.integers(-1, 2**31 - 1), st.binary(min_size=1, max_size=300)),
                          min_size=1, max_size=8).map(tuple), st.binary(min_size=64, max_size=64)))
def test_signing_bytes_of_well_formed_sets_equal_the_reference(ms: MessageSet) -> None:
    assert signing_bytes(ms) == ref_signing_bytes(ms)


ONE = (SealedMessage(0, b"x"),)
ODD = [
    MessageSet("s", None, "d", True, b"n", "k", ONE),  # a bool is not an i64
    MessageSet("s", None, "d", 2**63, b"n", "k", ONE),  # out of range
    MessageSet("s", None, "d", 1.0, b"n", "k", ONE),  # type: ignore[arg-type]
    MessageSet("s", None, "d", 5, bytearray(b"n"), "k", ONE),  # type: ignore[arg-type]
    MessageSet("s", None, "d", 5, memoryview(b"nonce"), "k", ONE),  # type: ignore[arg-type]
    MessageSet(Name("s"), Name("c"), Name("d"), 5, b"n", Name("k"), ONE),
    MessageSet("s", "", "d", 5, b"n", "k", ONE),  # an empty crowd is not a null one
    MessageSet("s\ud800", None, "d", 5, b"n", "k", ONE),  # unencodable text
    MessageSet("s", "c\udfff", "d", 5, b"n", "k", ONE),
    MessageSet("s", None, "d", 5, b"n", "k", (SealedMessage(True, b"x"),)),
    MessageSet("s", None, "d", 5, b"n", "k", (SealedMessage(Channel.PRESENCE, b"x"), SealedMessage(Channel.FIRST, b"y"))
               ),
    MessageSet("s", None, "d", 5, b"n", "k", (SealedMessage(0, bytearray(b"x")),)),  # type: ignore[arg-type]
    MessageSet("s", None, "d", 5, b"n", "k", (SealedMessage(0, "text"),)),  # type: ignore[arg-type]
    MessageSet("s", None, "d", 5, b"n", "k", (SealedMessage(2**63, b"x"),)),
    MessageSet("s", None, "d", 5, b"n", "k", ()),
    MessageSet(None, None, "d", 5, b"n", "k", ONE),  # type: ignore[arg-type]
    MessageSet("s", 7, "d", 5, b"n", "k", ONE),  # type: ignore[arg-type]
    MessageSet("s", None, b"d", 5, b"n", "k", ONE),  # type: ignore[arg-type]
    MessageSet("s", None, "d", 5, None, "k", ONE),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("ms", ODD, ids=range(len(ODD)))
def test_odd_field_types_give_the_reference_bytes_or_its_exception(ms: MessageSet) -> None:
    same_outcome(signing_bytes, ref_signing_bytes, ms)
