"""The rate each job could reach if it did nothing but its per-record public-key cryptography.

What a job cannot avoid per record: the encoder (acting for simulated devices) derives the device's key,
signs the set and seals each message (two X25519 multiplications, HKDF, ChaCha20-Poly1305); the shuffler
verifies each set's Ed25519 signature; the analyzer opens each message (one X25519 multiplication, HKDF,
ChaCha20-Poly1305). Measured here on this machine, one thread, median of 3, with the libraries the jobs use
(libsodium for Ed25519 and X25519, ``cryptography`` for HKDF and the AEAD); all three jobs spread their
GIL-free calls over ``cores`` threads (``transforms.runtime.parallel``), so the ceiling is ``cores`` times the
one-thread rate (an upper bound: HKDF and the AEAD stay on one thread).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transforms.trust.ed25519 import SodiumSigner, verify_detached
from transforms.trust.sealing import associated_data, open_sealed, seal


def _seconds_per_op(fn: Callable[[int], object], n: int) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for i in range(n):
            fn(i)
        times.append((time.perf_counter() - started) / n)
    return statistics.median(times)


def per_record_seconds(messages_per_set: float, n: int = 400) -> dict[str, float]:
    """CPU seconds of cryptography per Kafka record of each job (a set for encode/shuffle, a message for analyze)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    analyzer = X25519PrivateKey.generate()
    ad = associated_data("spec", None, 3_600_000, 0)
    payload = os.urandom(16)
    signer = SodiumSigner(os.urandom(32))
    body = os.urandom(200 + 90 * int(messages_per_set))
    signature = signer.sign(body)
    public = signer.public_bytes_raw()
    blobs = [seal(analyzer.public_key(), "k", payload, ad) for _ in range(n)]
    private = {"k": analyzer}
    master = os.urandom(32)

    def device_key(i: int) -> object:
        seed = HKDF(hashes.SHA256(), 32, salt=None, info=b"bench" + i.to_bytes(4, "big")).derive(master)
        return SodiumSigner(seed)

    key = _seconds_per_op(device_key, n)
    sign = _seconds_per_op(lambda i: signer.sign(body), n)
    sealing = _seconds_per_op(lambda i: seal(analyzer.public_key(), "k", payload, ad), n)
    verify = _seconds_per_op(lambda i: verify_detached(public, signature, body), n)
    opening = _seconds_per_op(lambda i: open_sealed(private, blobs[i], ad), n)
    return {"encode": key + sign + messages_per_set * sealing, "shuffle": verify, "analyze": opening}


def ceilings(messages_per_set: float, cores: int) -> dict[str, float]:
    """Records per second of wall time each job's cryptography alone allows (see the module doc)."""
    seconds = per_record_seconds(messages_per_set)
    return {"encode": cores / seconds["encode"], "shuffle": cores / seconds["shuffle"],
            "analyze": cores / seconds["analyze"]}
