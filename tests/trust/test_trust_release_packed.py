"""The array encoder of signed release batches writes exactly the bytes of the per-message reference path."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from schemas import WireFormatError
from transforms.trust.message_set import SealedMessage, messages_bytes
from transforms.trust.release import (
    ReleaseBatch,
    decode_release_batch,
    encode_release_batch,
    release_id_of,
    sign_release_batch,
)
from transforms.trust.release_packed import avro_messages, canonical_messages, signed_batch_bytes

SIGNER = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _arrays(messages: list[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray, bytes]:
    channels = np.asarray([c for c, _ in messages], np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(p) for _, p in messages])]).astype(np.int64)
    return channels, offsets, b"".join(p for _, p in messages)


def _batch(crowd: str | None, deleted: int | None, count: int) -> ReleaseBatch:
    return ReleaseBatch(release_id_of("spec-1", crowd, 3_600_000), "spec-1", crowd, 3_600_000, 1, 3, 40_000,
                        count + 7, deleted, ())


def _reference(batch: ReleaseBatch, messages: list[tuple[int, bytes]], key_id: str) -> bytes:
    sealed = tuple(SealedMessage(c, p) for c, p in messages)
    return encode_release_batch(sign_release_batch(replace(batch, messages=sealed), key_id, SIGNER))


CASES = {
    "uniform one-byte channels": lambda rng: [(int(c), rng.bytes(90)) for c in rng.integers(0, 64, 300)],
    "presence markers and wide channels": lambda rng: [(int(c), rng.bytes(60)) for c in
                                                       rng.choice([-1, 0, 5, 63, 64, 200, 9000, 2**31 - 1], 200)],
    "payloads of several lengths": lambda rng: [(int(rng.integers(0, 8)), rng.bytes(int(n)))
                                               for n in rng.integers(1, 4097, 50)],
    "one message": lambda rng: [(3, rng.bytes(1))],
    "no message": lambda rng: [],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("crowd", "deleted", "key_id"),
                         [(None, None, "shuffler-1"), ("de", 12, "k\u00e9y-" + "x" * 80)])
def test_packed_batch_is_byte_identical_to_the_reference(case: str, crowd: str | None, deleted: int | None,
                                                         key_id: str) -> None:
    messages = CASES[case](np.random.default_rng(len(case)))
    channels, offsets, payload = _arrays(messages)
    batch = _batch(crowd, deleted, len(messages))
    expected = _reference(batch, messages, key_id)
    assert signed_batch_bytes(batch, channels, offsets, payload, key_id, SIGNER) == expected
    sealed = tuple(SealedMessage(c, p) for c, p in messages)
    assert canonical_messages(channels, offsets, payload) == messages_bytes(sealed)
    decoded = decode_release_batch(expected)
    assert [(m.channel, m.sealed) for m in decoded.messages] == messages
    if not messages:
        assert avro_messages(channels, offsets, payload) == b"\x00"


@pytest.mark.parametrize(("messages", "reason"), [
    ([(0, b"ab"), (-2, b"cd")], "channel out of range"),
    ([(0, b"ab"), (2**31, b"cd")], "channel out of range"),
    ([(0, b"ab"), (1, b"")], "sealed message must be 1..4096 bytes"),
    ([(0, b"x" * 4097)], "sealed message must be 1..4096 bytes"),
])
def test_packed_batch_refuses_what_the_reference_refuses(messages: list[tuple[int, bytes]], reason: str) -> None:
    channels, offsets, payload = _arrays(messages)
    batch = _batch(None, None, len(messages))
    with pytest.raises(WireFormatError, match=reason):
        _reference(batch, messages, "k")
    with pytest.raises(WireFormatError, match=reason):
        signed_batch_bytes(batch, channels, offsets, payload, "k", SIGNER)


def test_packed_batch_refuses_more_messages_than_the_release_declares() -> None:
    channels, offsets, payload = _arrays([(0, b"a"), (1, b"b")])
    batch = ReleaseBatch(release_id_of("s", None, 0), "s", None, 0, 0, 1, 1, 1, None, ())
    with pytest.raises(WireFormatError, match="release declares 1"):
        signed_batch_bytes(batch, channels, offsets, payload, "k", SIGNER)
