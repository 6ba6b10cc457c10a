"""The CPU floor of each job: the per-record public-key cryptography it cannot avoid, on one thread.

What a job cannot avoid per Kafka record (measured on this machine, one thread, median of 3, with the libraries
the jobs use: libsodium for Ed25519 and X25519, ``cryptography`` for HKDF and the AEAD):

- encode, per message set (acting for simulated devices): derive the device's signing key, seal each message to
  the analyzer, sign the set, then seal the signed set whole to the shuffler (the nested envelope,
  ``transforms.trust.envelope``: one more X25519 exchange, HKDF and AEAD over the whole set);
- shuffle, per message set: open the envelope, then verify the set's Ed25519 signature;
- analyze, per message: open it (one X25519 exchange, HKDF, ChaCha20-Poly1305).

``floor_seconds`` is that work in CPU seconds per record: a job's own CPU seconds per record can only be larger,
so ``floor / measured`` is the share of its CPU the unavoidable cryptography takes. CPU seconds barely move
with the machine's load while wall rates do, so that share is the figure to compare across runs. ``ceilings``
keeps the wall-time view: ``cores`` threads could at best run ``cores / floor`` records a second.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from transforms.trust.ed25519 import SodiumSigner, verify_detached
from transforms.trust.envelope import open_envelope, seal_envelope
from transforms.trust.sealing import associated_data, open_sealed, seal

SET_HEADER_BYTES = 200  # routing fields, device id, key ids, nonce and signature of one encoded set
SEALED_MESSAGE_BYTES = 90  # one sealed message inside a set (header, ephemeral key, tag, small payload)


def _cpu_seconds_per_op(fn: Callable[[int], object], n: int) -> float:
    """Median over 3 passes of this thread's CPU seconds per call (not wall time: stable under load)."""
    times = []
    for _ in range(3):
        started = time.thread_time()
        for i in range(n):
            fn(i)
        times.append((time.thread_time() - started) / n)
    return statistics.median(times)


def floor_seconds(messages_per_set: float, n: int = 400) -> dict[str, float]:
    """CPU seconds of unavoidable cryptography per Kafka record of each job, one thread (see the module doc)."""
    analyzer = X25519PrivateKey.generate()
    shuffler = X25519PrivateKey.generate()
    ad = associated_data("spec", None, 3_600_000, 0)
    payload = os.urandom(16)
    signer = SodiumSigner(os.urandom(32))
    body = os.urandom(SET_HEADER_BYTES + SEALED_MESSAGE_BYTES * round(messages_per_set))
    signature = signer.sign(body)
    public = signer.public_bytes_raw()
    blobs = [seal(analyzer.public_key(), "k", payload, ad) for _ in range(n)]
    envelopes = [seal_envelope(shuffler.public_key(), "s", body + signature) for _ in range(n)]
    analyzer_keys, shuffler_keys = {"k": analyzer}, {"s": shuffler}
    master = os.urandom(32)

    def device_key(i: int) -> object:
        seed = HKDF(hashes.SHA256(), 32, salt=None, info=b"bench" + i.to_bytes(4, "big")).derive(master)
        return SodiumSigner(seed)

    key = _cpu_seconds_per_op(device_key, n)
    sign = _cpu_seconds_per_op(lambda i: signer.sign(body), n)
    sealing = _cpu_seconds_per_op(lambda i: seal(analyzer.public_key(), "k", payload, ad), n)
    envelope = _cpu_seconds_per_op(lambda i: seal_envelope(shuffler.public_key(), "s", body + signature), n)
    unwrap = _cpu_seconds_per_op(lambda i: open_envelope(shuffler_keys, envelopes[i]), n)
    verify = _cpu_seconds_per_op(lambda i: verify_detached(public, signature, body), n)
    opening = _cpu_seconds_per_op(lambda i: open_sealed(analyzer_keys, blobs[i], ad), n)
    return {"encode": key + messages_per_set * sealing + sign + envelope, "shuffle": unwrap + verify,
            "analyze": opening}


def ceilings(messages_per_set: float, cores: int) -> dict[str, float]:
    """Records per second of wall time each job's cryptography alone allows on ``cores`` threads."""
    return {stage: cores / seconds for stage, seconds in floor_seconds(messages_per_set).items()}


if __name__ == "__main__":
    for stage, seconds in floor_seconds(1.0).items():
        print(f"{stage:<8} {seconds * 1e6:7.1f} us CPU per record (one message per set)")
