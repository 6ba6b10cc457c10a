"""The edge encoder's keys: labelled sub-keys of its one secret, ``keys/encoder/prf.key``.

The encoder keys three different PRFs -- the per-event randomness (SipHash, ``transforms.encoder.encode``), the
permanent backstops (BLAKE2b, ``transforms.device.backstop``) and the sealing nonces and ephemerals (BLAKE2b,
``transforms.encoder.seal``). Feeding the same secret bytes to several PRFs ties their security to each other's
(once, two of them read overlapping bytes of the file); each now gets its own sub-key, derived with
HKDF-SHA256 (RFC 5869, "HMAC-based Extract-and-Expand Key Derivation Function", Krawczyk and Eronen, 2010)
under a distinct label, so learning or misusing one sub-key reveals nothing about another.

Changing the derivation changes every encoder output: finish (or abandon) a bounded encode run before
upgrading across this change, or a rerun of the old run would send differently randomized reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from transforms.mechanisms.randomness import job_key_from_seed
from transforms.trust.keys import load_or_create_secret
from transforms.trust.layout import KeysDir

__all__ = ["ENCODER_SECRET", "EncoderKeys"]

ENCODER_SECRET = KeysDir(Path()).encoder_prf_key  # relative to a keys directory
SALT = b"esa-telemetry encoder keys v1"
LABELS = {"randomize": (b"esa-telemetry/encoder/randomize", 16),  # SipHash-2-4 takes 16 bytes
          "backstop": (b"esa-telemetry/encoder/backstop", 32),
          "seal": (b"esa-telemetry/encoder/seal", 32)}


def _hkdf(secret: bytes, label: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=SALT, info=label).derive(secret)


@dataclass(frozen=True)
class EncoderKeys:
    """The three sub-keys; build them with ``derive``, ``from_keys_dir`` or (tests only) ``from_seed``."""

    randomize: bytes
    backstop: bytes
    seal: bytes

    @classmethod
    def derive(cls, secret: bytes) -> EncoderKeys:
        """Sub-keys of a 16..64-byte secret (the key file holds 32 bytes of OS entropy)."""
        if not isinstance(secret, bytes) or not 16 <= len(secret) <= 64:
            got = len(secret) if isinstance(secret, bytes) else type(secret).__name__
            raise ValueError(f"the encoder key must have at least 16 bytes (at most 64), got {got}")
        return cls(**{name: _hkdf(secret, label, length) for name, (label, length) in LABELS.items()})

    @classmethod
    def from_keys_dir(cls, keys_dir: Path | str) -> EncoderKeys:
        """Sub-keys of ``keys_dir/encoder/prf.key`` (created from OS entropy if absent)."""
        return cls.derive(load_or_create_secret(Path(keys_dir) / ENCODER_SECRET))

    @classmethod
    def from_seed(cls, seed: int) -> EncoderKeys:
        """Sub-keys of a secret derived from a seed: tests and simulations only (logged once)."""
        return cls.derive(job_key_from_seed(seed))

    def __repr__(self) -> str:  # never print key material into a log or a traceback
        return "EncoderKeys(<secret>)"
