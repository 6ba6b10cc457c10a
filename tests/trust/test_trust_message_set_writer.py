"""The direct MessageSet writer writes fastavro's bytes exactly, for every set that passes the checks.

A device's set is signed over canonical fields, not over these bytes, but the shuffler dedupes and the
encoder's reruns rely on byte-identical re-sends (``transforms.encoder.seal``): the writer must be a drop-in for
``encode_record("MessageSet", ...)``, including multi-byte varints and lengths and empty crowds.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import SCHEMA_VERSION, encode_record
from transforms.trust.message_set import (
    MAX_CHANNEL,
    MIN_CHANNEL,
    MessageSet,
    SealedMessage,
    decode_message_set,
    encode_message_set,
)
from transforms.trust.message_set_writer import write_message_set


def fastavro_bytes(ms: MessageSet) -> bytes:
    record = {"schema_version": SCHEMA_VERSION, "spec_id": ms.spec_id, "crowd_id": ms.crowd_id,
              "device_id": ms.device_id, "event_time": ms.event_time_ms, "nonce": ms.nonce, "key_id": ms.key_id,
              "messages": [{"channel": m.channel, "sealed": m.sealed} for m in ms.messages],
              "signature": ms.signature}
    return encode_record("MessageSet", record, check=False)


ids = st.text(min_size=1, max_size=200).filter(lambda s: len(s) <= 200)
sets = st.builds(
    MessageSet, spec_id=ids, crowd_id=st.one_of(st.none(), st.text(max_size=200)),
    device_id=st.text("0123456789abcdef", min_size=32, max_size=32),
    event_time_ms=st.one_of(st.integers(0, 2**53 - 1), st.sampled_from([0, 63, 64, 2**53 - 1])),
    nonce=st.binary(min_size=16, max_size=16), key_id=ids,
    messages=st.lists(st.builds(SealedMessage,
                                st.one_of(st.integers(MIN_CHANNEL, MAX_CHANNEL), st.sampled_from([-1, 63, 64, 31])),
                                st.binary(min_size=1, max_size=4096)), min_size=1, max_size=40).map(tuple),
    signature=st.binary(min_size=64, max_size=64))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(sets)
def test_writer_equals_fastavro_and_round_trips(ms: MessageSet) -> None:
    data = encode_message_set(ms)
    assert data == fastavro_bytes(ms)
    assert decode_message_set(data) == ms


def test_writer_edges_by_hand() -> None:
    """Length and varint boundaries (63/64 one or two bytes, 8191/8192 two or three) and the empty array."""
    for size in (1, 63, 64, 127, 128, 4096):
        for channel in (-1, 0, 63, 64, 2**31 - 1):
            ms = MessageSet("s" * 64, "", "ab" * 16, 2**53 - 1, b"n" * 16, "k", (SealedMessage(channel, b"x" * size),),
                            b"g" * 64)
            assert encode_message_set(ms) == fastavro_bytes(ms)
    empty = MessageSet("s", None, "ab" * 16, 0, b"n" * 16, "k", (), b"g" * 64)
    assert write_message_set(empty.spec_id, None, empty.device_id, 0, empty.nonce, "k", (), empty.signature) \
        == fastavro_bytes(empty)
