"""Ed25519 signing and verification on the hot paths, through libsodium (PyNaCl).

Why not ``cryptography`` (OpenSSL) here: on this machine libsodium verifies a set in 59 microseconds against
105 and signs in 20 against 32 (``benchmarks/trust.py``), and the shuffler's one verification per set is its
throughput ceiling. The signatures are the same RFC 8032 bytes (deterministic; tested against
``cryptography``), so the wire does not change and keys stay interchangeable: a device or a key file made
with one library works with the other.

libsodium's verification is the stricter of the two: it also refuses public keys of small order and
non-canonical encodings of R or the key, which no honest signer produces; anything it accepts, OpenSSL
accepts too (tested on honest, tampered and crafted inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.bindings import crypto_sign, crypto_sign_open, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError, CryptoError

from transforms.runtime.parallel import map_ordered

__all__ = ["PUBLIC_KEY_BYTES", "SEED_BYTES", "SIGNATURE_BYTES", "Signer", "SodiumSigner", "derive_signers", "sign_many",
           "verify_detached"]

PUBLIC_KEY_BYTES = 32
SEED_BYTES = 32
SIGNATURE_BYTES = 64


class Signer(Protocol):
    """What signs a set or a release batch: ``cryptography``'s Ed25519PrivateKey or a ``SodiumSigner``."""
    def sign(self, data: bytes) -> bytes: ...

    def public_key(self) -> Ed25519PublicKey: ...


class SodiumSigner:
    """An Ed25519 private key held as libsodium's expanded secret key, derived from a 32-byte seed (the
    same seed ``Ed25519PrivateKey.from_private_bytes`` takes, giving the same key and signatures)."""
    __slots__ = ("_public", "_secret")

    def __init__(self, seed: bytes) -> None:
        if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
            raise ValueError(f"an Ed25519 seed is {SEED_BYTES} bytes")
        self._public, self._secret = crypto_sign_seed_keypair(seed)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte detached signature of ``data``."""
        return crypto_sign(bytes(data), self._secret)[:SIGNATURE_BYTES]

    def public_bytes_raw(self) -> bytes:
        return self._public

    def public_key(self) -> Ed25519PublicKey:
        """As ``Ed25519PrivateKey.public_key()``, so either kind of key serves the device client."""
        return Ed25519PublicKey.from_public_bytes(self._public)

    def __repr__(self) -> str:  # never print key material
        return f"SodiumSigner(public={self._public.hex()[:16]}...)"

    def __reduce__(self) -> tuple:
        raise TypeError("a signing key is not pickled: load it where it is used")


def sign_many(signers: Sequence[Signer], data: Sequence[bytes], threads: int = 1) -> list[bytes]:
    """``signer.sign(d)`` for each pair; libsodium keys sign on ``threads`` (the call is all the pool runs),
    any other key on the calling thread."""
    sodium = [i for i, s in enumerate(signers) if isinstance(s, SodiumSigner)]
    jobs = [(signers[i]._secret, bytes(data[i])) for i in sodium]  # type: ignore[attr-defined]
    signed = map_ordered(_sign, jobs, threads)
    out = [b""] * len(signers)
    for i, signature in zip(sodium, signed, strict=True):
        out[i] = signature
    for i, signer in enumerate(signers):
        if not isinstance(signer, SodiumSigner):
            out[i] = signer.sign(data[i])
    return out


def _sign(job: tuple[bytes, bytes]) -> bytes:
    secret, data = job
    return crypto_sign(data, secret)[:SIGNATURE_BYTES]


def derive_signers(seeds: Sequence[bytes], threads: int = 1) -> list[SodiumSigner]:
    """``SodiumSigner(seed)`` for each seed, the key expansion (18 microseconds each here) on ``threads``."""
    for seed in seeds:
        if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
            raise ValueError(f"an Ed25519 seed is {SEED_BYTES} bytes")
    pairs = map_ordered(crypto_sign_seed_keypair, list(seeds), threads)
    out = []
    for public, secret in pairs:
        signer = SodiumSigner.__new__(SodiumSigner)
        signer._public, signer._secret = public, secret
        out.append(signer)
    return out


def verify_detached(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` under the raw ``public_key``.

    Never raises for wrong-sized or malformed inputs (they are simply not valid); libsodium releases the GIL
    while it computes, so callers may run this on a thread pool (``transforms.runtime.parallel``).
    """
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        crypto_sign_open(bytes(signature) + bytes(data), bytes(public_key))
    except (BadSignatureError, CryptoError, ValueError, TypeError):
        return False
    return True
