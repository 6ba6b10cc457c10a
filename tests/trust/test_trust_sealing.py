"""Sealing to the analyzer: round trips, tampering, routing binding, rotation, reproducibility, unlinkability."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from trust_helpers import CROWD, SPEC, WINDOW_END, Trust

from transforms.trust import (
    SealError,
    associated_data,
    generate_analyzer_key,
    key_id_of,
    load_analyzer_private,
    load_analyzer_public,
    open_sealed,
    seal,
)
from transforms.trust.sealing import SEAL_OVERHEAD

AD = associated_data(SPEC, CROWD, WINDOW_END, 3)


def test_round_trip_and_layout(trust: Trust) -> None:
    for plaintext in (b"", b"x", os.urandom(1000)):
        blob = seal(trust.analyzer_public, trust.analyzer_id, plaintext, AD)
        assert len(blob) == len(plaintext) + len(trust.analyzer_id) + SEAL_OVERHEAD
        assert blob[0] == 1 and blob[1] == len(trust.analyzer_id)
        assert blob[2:2 + blob[1]].decode() == trust.analyzer_id == key_id_of(blob)
        assert open_sealed(trust.analyzer_private, blob, AD) == plaintext


def test_associated_data_is_canonical_and_injective() -> None:
    variants = {associated_data(SPEC, CROWD, WINDOW_END, 3), associated_data(SPEC, None, WINDOW_END, 3),
                associated_data(SPEC, "", WINDOW_END, 3), associated_data(SPEC + "v", "1.2", WINDOW_END, 3),
                associated_data(SPEC, CROWD, WINDOW_END + 1, 3), associated_data(SPEC, CROWD, WINDOW_END, 4)}
    assert len(variants) == 6
    assert b"esa-seal-v1" in AD and associated_data(SPEC, CROWD, WINDOW_END, 3) == AD


@pytest.mark.parametrize("other", [associated_data(SPEC, None, WINDOW_END, 3),
                                   associated_data(SPEC, "v1.3", WINDOW_END, 3),
                                   associated_data("other@0123456789ab", CROWD, WINDOW_END, 3),
                                   associated_data(SPEC, CROWD, WINDOW_END + 3_600_000, 3),
                                   associated_data(SPEC, CROWD, WINDOW_END, 0)],
                         ids=["no-crowd", "crowd", "spec", "window", "channel"])
def test_other_routing_fields_fail_to_open(trust: Trust, other: bytes) -> None:
    blob = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    with pytest.raises(SealError, match="authentication failed"):
        open_sealed(trust.analyzer_private, blob, other)


def test_every_flipped_byte_fails(trust: Trust) -> None:
    blob = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    for i in range(len(blob)):
        tampered = bytearray(blob)
        tampered[i] ^= 0x01
        with pytest.raises(SealError):
            open_sealed(trust.analyzer_private, bytes(tampered), AD)
    for cut in range(len(blob)):
        with pytest.raises(SealError):
            open_sealed(trust.analyzer_private, blob[:cut], AD)


def test_specific_refusals(trust: Trust) -> None:
    blob = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    with pytest.raises(SealError, match="unsupported version 2"):
        open_sealed(trust.analyzer_private, b"\x02" + blob[1:], AD)
    with pytest.raises(SealError, match="truncated"):
        open_sealed(trust.analyzer_private, blob[:-17 - 1 - len(b"payload")], AD)
    with pytest.raises(SealError, match="unknown key id"):
        open_sealed({}, blob, AD)
    low_order = blob[:2 + len(trust.analyzer_id)] + bytes(32) + blob[2 + len(trust.analyzer_id) + 32:]
    with pytest.raises(SealError, match="invalid ephemeral key"):
        open_sealed(trust.analyzer_private, low_order, AD)
    with pytest.raises(ValueError, match="ascii"):
        seal(trust.analyzer_public, "clé", b"x", AD)


def test_rotation_old_key_id_still_opens_new_seals_use_the_newest(trust: Trust) -> None:
    old_blob = seal(trust.analyzer_public, trust.analyzer_id, b"old", AD)
    new_id = generate_analyzer_key(trust.keys_dir)
    newest = new_id  # same day: the key written last is the newest
    key_id, public = load_analyzer_public(trust.keys_dir)
    assert key_id == newest
    new_blob = seal(public, key_id, b"new", AD)
    assert key_id_of(new_blob) == newest
    private = load_analyzer_private(trust.keys_dir)
    assert open_sealed(private, old_blob, AD) == b"old"
    assert open_sealed(private, new_blob, AD) == b"new"
    retired = {k: v for k, v in private.items() if k != trust.analyzer_id}
    with pytest.raises(SealError, match="unknown key id"):
        open_sealed(retired, old_blob, AD)


def test_a_wrong_private_key_under_the_right_id_fails(trust: Trust) -> None:
    blob = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    with pytest.raises(SealError, match="authentication failed"):
        open_sealed({trust.analyzer_id: X25519PrivateKey.generate()}, blob, AD)


def test_given_ephemeral_is_reproducible_random_is_not(trust: Trust) -> None:
    eph = bytes(range(32))
    a = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD, ephemeral=eph)
    assert a == seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD, ephemeral=eph)
    assert a != seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD, ephemeral=bytes(range(1, 33)))
    r1 = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    r2 = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    assert r1 != r2
    with pytest.raises(ValueError, match="32 bytes"):
        seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD, ephemeral=b"short")


def test_two_seals_of_one_plaintext_share_nothing_beyond_the_header(trust: Trust) -> None:
    header = 2 + len(trust.analyzer_id)
    pairs = [(seal(trust.analyzer_public, trust.analyzer_id, b"same payload " * 4, AD),
              seal(trust.analyzer_public, trust.analyzer_id, b"same payload " * 4, AD)) for _ in range(20)]
    equal_positions = sum(x == y for a, b in pairs for x, y in zip(a[header:], b[header:], strict=True))
    total = sum(len(a) - header for a, _ in pairs)
    # Independent uniform bytes agree with probability 1/256: expect total/256 (about 5), allow 6 sd.
    mean = total / 256
    assert equal_positions <= mean + 6 * mean**0.5
    for a, b in pairs:
        assert a[:header] == b[:header]
        assert a[header:header + 32] != b[header:header + 32]  # fresh ephemeral key per message


def test_associated_data_must_be_bytes(trust: Trust) -> None:
    blob = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD)
    with pytest.raises(SealError, match="associated data must be bytes"):
        open_sealed(trust.analyzer_private, blob, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="associated data must be bytes"):
        seal(trust.analyzer_public, trust.analyzer_id, b"payload", "spec")  # type: ignore[arg-type]


def test_libsodium_key_agreement_matches_openssl(trust: Trust) -> None:
    """The seal is computed with libsodium; rebuild it with cryptography's X25519 (OpenSSL), byte for byte."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    for _ in range(20):
        eph = os.urandom(32)  # unclamped on purpose: both libraries must clamp the same way
        blob = seal(trust.analyzer_public, trust.analyzer_id, b"payload", AD, ephemeral=eph)
        eph_key = X25519PrivateKey.from_private_bytes(eph)
        eph_pub = eph_key.public_key().public_bytes_raw()
        recipient = trust.analyzer_public.public_bytes_raw()
        key = HKDF(hashes.SHA256(), 32, salt=eph_pub + recipient, info=b"esa-seal-v1").derive(
            eph_key.exchange(trust.analyzer_public))
        header = bytes((1, len(trust.analyzer_id))) + trust.analyzer_id.encode()
        assert blob == header + eph_pub + ChaCha20Poly1305(key).encrypt(bytes(12), b"payload", AD)
