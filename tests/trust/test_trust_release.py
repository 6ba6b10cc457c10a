"""Shuffler-signed release batches: ids, signing and tampering, rotation, wire checks, size-bounded splitting."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from trust_helpers import CROWD, SPEC, WINDOW_END, Trust

from schemas import WireFormatError, encode_record
from transforms.trust import (
    AuthError,
    ReleaseBatch,
    SealedMessage,
    decode_release_batch,
    encode_release_batch,
    generate_shuffler_key,
    load_shuffler_signer,
    load_shuffler_verifiers,
    release_id_of,
    sign_release_batch,
    split_into_batches,
    verify_release_batch,
)
from transforms.trust.release import BATCH_HEADER_BYTES, encoded_size


def batch(messages: tuple[SealedMessage, ...], index: int = 0, count: int = 1,
          deleted: int | None = 3) -> ReleaseBatch:
    return ReleaseBatch(release_id_of(SPEC, CROWD, WINDOW_END), SPEC, CROWD, WINDOW_END, index, count,
                        n_sets=len(messages), n_messages=len(messages) * count, deleted=deleted, messages=messages)


MESSAGES = (SealedMessage(0, b"\x01aaa"), SealedMessage(2, b"\x01bbb"), SealedMessage(0, b"\x01ccc"))


def test_release_id_is_deterministic_domain_separated_and_injective() -> None:
    rid = release_id_of(SPEC, CROWD, WINDOW_END)
    assert len(rid) == 32 and int(rid, 16) >= 0 and rid == release_id_of(SPEC, CROWD, WINDOW_END)
    others = {release_id_of(SPEC, None, WINDOW_END), release_id_of(SPEC, "", WINDOW_END),
              release_id_of(SPEC, CROWD, WINDOW_END + 1), release_id_of(SPEC + "x", CROWD, WINDOW_END)}
    assert rid not in others and len(others) == 4
    assert rid != hashlib.sha256(SPEC.encode()).hexdigest()[:32]


def test_round_trip_sign_encode_decode_verify(trust: Trust) -> None:
    for deleted in (None, 0, 17):
        signed = sign_release_batch(batch(MESSAGES, deleted=deleted), trust.shuffler_id, trust.shuffler_signer)
        assert signed.key_id == trust.shuffler_id and len(signed.signature) == 64
        decoded = decode_release_batch(encode_release_batch(signed))
        assert decoded == signed
        verify_release_batch(decoded, trust.shuffler_verifiers)
    empty = sign_release_batch(batch(()), trust.shuffler_id, trust.shuffler_signer)
    verify_release_batch(decode_release_batch(encode_release_batch(empty)), trust.shuffler_verifiers)


TAMPERS = {
    "release_id": lambda b: replace(b, release_id="0" * 32),
    "spec_id": lambda b: replace(b, spec_id="x"),
    "crowd_id": lambda b: replace(b, crowd_id=None),
    "window_end": lambda b: replace(b, window_end_ms=b.window_end_ms - 1),
    "batch_index": lambda b: replace(b, batch_index=1),
    "batch_count": lambda b: replace(b, batch_count=5),
    "n_sets": lambda b: replace(b, n_sets=b.n_sets + 1),
    "n_messages": lambda b: replace(b, n_messages=b.n_messages + 1),
    "deleted": lambda b: replace(b, deleted=None),
    "message": lambda b: replace(b, messages=(SealedMessage(0, b"\x01aab"), *b.messages[1:])),
    "channel": lambda b: replace(b, messages=(SealedMessage(1, b.messages[0].sealed), *b.messages[1:])),
    "order": lambda b: replace(b, messages=b.messages[::-1]),
    "dropped": lambda b: replace(b, messages=b.messages[1:]),
    "signature": lambda b: replace(b, signature=b.signature[:-1] + bytes([b.signature[-1] ^ 1])),
}


@pytest.mark.parametrize("field", list(TAMPERS))
def test_tampering_any_field_fails(trust: Trust, field: str) -> None:
    signed = sign_release_batch(batch(MESSAGES, count=2), trust.shuffler_id, trust.shuffler_signer)
    verify_release_batch(signed, trust.shuffler_verifiers)
    with pytest.raises(AuthError, match=r"^bad shuffler signature$"):
        verify_release_batch(TAMPERS[field](signed), trust.shuffler_verifiers)


def test_key_ids_unknown_swapped_and_rotated(trust: Trust) -> None:
    signed = sign_release_batch(batch(MESSAGES), trust.shuffler_id, trust.shuffler_signer)
    with pytest.raises(AuthError, match=r"^unknown shuffler key id$"):
        verify_release_batch(signed, {})
    new_id = generate_shuffler_key(trust.keys_dir)
    verifiers = load_shuffler_verifiers(trust.keys_dir)
    verify_release_batch(signed, verifiers)  # the old key still verifies after rotation
    signer_id, signer = load_shuffler_signer(trust.keys_dir)
    assert signer_id == new_id  # same day: the key written last is the newest
    verify_release_batch(sign_release_batch(batch(MESSAGES), signer_id, signer), verifiers)
    with pytest.raises(AuthError, match="bad shuffler signature"):  # a signature under one id fails under another
        verify_release_batch(replace(signed, key_id=new_id), verifiers)


@pytest.mark.parametrize(("tamper", "reason"), [
    (lambda b: replace(b, batch_index=1, batch_count=1), "batch_index 1 outside"),
    (lambda b: replace(b, batch_index=-1), "batch_index -1 outside"),
    (lambda b: replace(b, n_sets=-1), "negative count"),
    (lambda b: replace(b, deleted=-2), "negative count"),
    (lambda b: replace(b, n_messages=2), "batch holds 3 messages, release declares 2"),
    (lambda b: replace(b, release_id="0" * 32), "release_id does not match"),
    (lambda b: replace(b, release_id="xyz"), "release_id must be 32"),
    (lambda b: replace(b, signature=b"\x00" * 10), "signature must be 64"),
    (lambda b: replace(b, key_id=""), "key_id must be"),
    (lambda b: replace(b, window_end_ms=-5), "window_end out of range"),
    (lambda b: replace(b, messages=(SealedMessage(0, b""),)), "sealed message must be"),
])
def test_wire_range_checks(trust: Trust, tamper, reason: str) -> None:  # type: ignore[no-untyped-def]
    signed = sign_release_batch(batch(MESSAGES), trust.shuffler_id, trust.shuffler_signer)
    bad = tamper(signed)
    with pytest.raises(WireFormatError, match=reason):
        encode_release_batch(bad)
    data = encode_record("ReleaseBatch", _record(bad))
    with pytest.raises(WireFormatError, match=reason):
        decode_release_batch(data)


def _record(b: ReleaseBatch) -> dict[str, object]:
    return {"schema_version": 1, "release_id": b.release_id, "spec_id": b.spec_id, "crowd_id": b.crowd_id,
            "window_end": b.window_end_ms, "batch_index": b.batch_index, "batch_count": b.batch_count,
            "n_sets": b.n_sets, "n_messages": b.n_messages, "deleted": b.deleted,
            "messages": [{"channel": m.channel, "sealed": m.sealed} for m in b.messages], "key_id": b.key_id,
            "signature": b.signature}


def test_split_respects_the_encoded_size_and_keeps_order(trust: Trust) -> None:
    sizes = [1, 50, 4096, 300, 4096, 7, 128] * 40
    messages = tuple(SealedMessage(i % 300, bytes([i % 256]) * s) for i, s in enumerate(sizes))
    max_bytes = 16 * 1024
    batches = split_into_batches(messages, max_bytes)
    assert tuple(m for b in batches for m in b) == messages
    assert all(len(b) >= 1 for b in batches)
    for i, part in enumerate(batches):
        whole = replace(batch(part), batch_index=i, batch_count=len(batches), n_messages=len(messages))
        signed = sign_release_batch(whole, trust.shuffler_id, trust.shuffler_signer)
        encoded = encode_release_batch(replace(signed, spec_id="s" * 200, crowd_id="c" * 200,
                                               release_id=release_id_of("s" * 200, "c" * 200, WINDOW_END)))
        assert len(encoded) <= max_bytes
        if i + 1 < len(batches):  # greedy: the next message would not have fit
            budget = max_bytes - BATCH_HEADER_BYTES
            assert sum(encoded_size(m) for m in part) + encoded_size(batches[i + 1][0]) > budget


def test_split_edge_cases() -> None:
    assert split_into_batches(()) == [()]
    huge = SealedMessage(0, b"x" * 4096)
    assert split_into_batches([huge] * 3, BATCH_HEADER_BYTES + 1024) == [(huge,)] * 3
    with pytest.raises(ValueError, match="max_bytes must be at least"):
        split_into_batches(MESSAGES, 100)
