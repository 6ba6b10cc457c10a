"""Cost of the trust boundaries on one core: what signing, sealing and verifying add per set and message.

For ``--n`` operations each (default 10^4), median of ``--repeats`` runs (default 5), prints the CPU time
per operation and the rate on one core:

* device side: Ed25519 signature of one message set (3 messages), sealing one 16-byte payload (fresh
  random ephemeral and PRF-supplied ephemeral), deriving a simulated device key (HKDF + Ed25519 key);
* device side, the outer layer: sealing one encoded set whole to the shuffler (nested encryption);
* shuffler side: opening that outer layer (one set, and a batch on 1 and 2 threads), verifying one set's
  signature (registry lookup included), decoding one set from Avro, signing a release batch;
* analyzer side: opening one sealed message, decoding and verifying a release batch.

Release batches hold ``--batch`` messages (default 100); their rate is in batches, with the cost per message.

    .venv/bin/python benchmarks/trust.py            # ~1.5 minutes
    .venv/bin/python benchmarks/trust.py --n 2000   # quick
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.trust import (
    DeviceRegistry,
    MessageSet,
    ReleaseBatch,
    SealedMessage,
    SimulatedFleet,
    associated_data,
    decode_message_set,
    decode_release_batch,
    encode_message_set,
    encode_release_batch,
    init_keys,
    load_analyzer_private,
    load_analyzer_public,
    load_shuffler_sealing_private,
    load_shuffler_sealing_public,
    load_shuffler_signer,
    load_shuffler_verifiers,
    open_sealed,
    release_id_of,
    seal,
    sign_message_set,
    sign_release_batch,
    signing_bytes,
    verify_message_set,
    verify_release_batch,
)
from transforms.trust.envelope import open_envelope, open_envelopes, seal_envelope, seal_envelopes


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median CPU time of this process over ``repeats`` runs: the cost on one core, robust to a shared
    machine's scheduling (wall-clock times there swing with other processes' load)."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.process_time()
        result = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), result


SPEC, CROWD, WINDOW_END = "app_language@0123456789ab", "v1.2", 1_700_002_800_000


def row(name: str, seconds: float, ops: int, unit: str = "op", extra: str = "") -> None:
    per = seconds / ops
    print(f"{name:<44} {per * 1e6:10.1f} us/{unit:<6} {1 / per:12,.0f} {unit}/s  {extra}")


def run(n: int, repeats: int, batch_size: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp)
        init_keys(keys)
        a_id, a_pub = load_analyzer_public(keys)
        a_priv = load_analyzer_private(keys)
        s_id, s_signer = load_shuffler_signer(keys)
        verifiers = load_shuffler_verifiers(keys)
        fleet = SimulatedFleet.from_keys_dir(keys)
        x_id, x_pub = load_shuffler_sealing_public(keys)
        x_priv = load_shuffler_sealing_private(keys)
    clients = [f"client-{i}" for i in range(n)]
    registry = DeviceRegistry()
    fleet.enroll(registry, clients)
    ad = associated_data(SPEC, CROWD, WINDOW_END, 0)
    payload = os.urandom(16)
    prf_key = os.urandom(32)
    ephemerals = [hashlib.blake2b(i.to_bytes(8, "big"), key=prf_key, digest_size=32).digest() for i in range(n)]
    blobs = [seal(a_pub, a_id, payload, ad) for _ in range(min(n, 1000))]
    messages = tuple(SealedMessage(c, blobs[c % len(blobs)]) for c in range(3))
    unsigned = [MessageSet(SPEC, CROWD, fleet.device_id(c), 1_700_000_000_000, os.urandom(16), a_id, messages)
                for c in clients]
    signed = [sign_message_set(ms, fleet.signing_key(c)) for ms, c in zip(unsigned, clients, strict=True)]
    encoded = [encode_message_set(ms) for ms in signed]
    envelopes = seal_envelopes(x_pub, x_id, encoded)
    n_batches = n
    batch_msgs = tuple(SealedMessage(i % 4, blobs[i % len(blobs)]) for i in range(batch_size))
    batch = ReleaseBatch(release_id_of(SPEC, CROWD, WINDOW_END), SPEC, CROWD, WINDOW_END, 0, 1, batch_size,
                         batch_size, None, batch_msgs)
    signed_batch = sign_release_batch(batch, s_id, s_signer)
    batch_bytes = encode_release_batch(signed_batch)

    def each(fn: Callable[[int], Any], count: int = n) -> Callable[[], None]:
        return lambda: [fn(i) for i in range(count)] and None

    print(f"CPU time on one core (load average {os.getloadavg()[0]:.1f}), median of {repeats} runs of {n:,} "
          f"operations; {len(messages)} messages per set, "
          f"16-byte payloads ({len(blobs[0])} bytes sealed), release batches of {batch_size} messages "
          f"({len(batch_bytes):,} bytes)")
    print("-- device")
    t, _ = median_time(each(lambda i: sign_message_set(unsigned[i], fleet.signing_key(clients[i]))), repeats)
    row("sign message set (libsodium, key cached)", t, n, "set")
    seeds = [os.urandom(32) for _ in range(n)]
    keys_openssl = [Ed25519PrivateKey.from_private_bytes(seed) for seed in seeds]
    t, _ = median_time(each(lambda i: sign_message_set(unsigned[i], keys_openssl[i])), repeats)
    row("  the same through OpenSSL", t, n, "set")
    t, _ = median_time(each(lambda i: seal(a_pub, a_id, payload, ad)), repeats)
    row("seal message (random ephemeral)", t, n, "msg")
    t, _ = median_time(each(lambda i: seal(a_pub, a_id, payload, ad, ephemeral=ephemerals[i])), repeats)
    row("seal message (PRF ephemeral, reproducible)", t, n, "msg")

    def derive(i: int) -> None:
        SimulatedFleet(b"m" * 32, cache_size=1).device_id(clients[i])
    t, _ = median_time(each(derive), repeats)
    row("simulated device key (HKDF + Ed25519 + id)", t, n, "dev")
    t, _ = median_time(each(lambda i: seal_envelope(x_pub, x_id, encoded[i])), repeats)
    row("seal set to the shuffler (outer layer)", t, n, "set", f"{len(envelopes[0]) - len(encoded[0])} bytes added")
    print("-- shuffler")
    t, _ = median_time(each(lambda i: open_envelope(x_priv, envelopes[i])), repeats)
    row("open the outer layer (one set)", t, n, "set")
    for threads in (1, 2):
        t, _ = median_time(lambda: open_envelopes(x_priv, envelopes, threads), repeats)  # noqa: B023
        row(f"  batched, {threads} thread(s)", t, n, "set")
    t, _ = median_time(each(lambda i: decode_message_set(encoded[i])), repeats)
    row("decode message set (Avro + range checks)", t, n, "set")
    t, _ = median_time(each(lambda i: verify_message_set(signed[i], registry)), repeats)
    row("verify message set (libsodium + registry)", t, n, "set")
    openssl = [(Ed25519PublicKey.from_public_bytes(registry.public_key(ms.device_id)), bytes(ms.signature),
                signing_bytes(ms)) for ms in signed]
    t, _ = median_time(each(lambda i: openssl[i][0].verify(openssl[i][1], openssl[i][2])), repeats)
    row("  the same through OpenSSL", t, n, "set")
    t, _ = median_time(each(lambda i: sign_release_batch(batch, s_id, s_signer), n_batches), repeats)
    row("sign release batch", t, n_batches, "batch", f"{t / (n_batches * batch_size) * 1e6:.2f} us/msg")
    t, _ = median_time(each(lambda i: encode_release_batch(signed_batch), n_batches), repeats)
    row("encode release batch", t, n_batches, "batch", f"{t / (n_batches * batch_size) * 1e6:.2f} us/msg")
    print("-- analyzer")
    t, _ = median_time(each(lambda i: open_sealed(a_priv, blobs[i % len(blobs)], ad)), repeats)
    row("open sealed message", t, n, "msg")
    t, _ = median_time(each(lambda i: decode_release_batch(batch_bytes), n_batches), repeats)
    row("decode release batch", t, n_batches, "batch", f"{t / (n_batches * batch_size) * 1e6:.2f} us/msg")
    t, _ = median_time(each(lambda i: verify_release_batch(signed_batch, verifiers), n_batches), repeats)
    row("verify release batch", t, n_batches, "batch", f"{t / (n_batches * batch_size) * 1e6:.2f} us/msg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="operations per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100, help="messages per release batch")
    args = parser.parse_args()
    run(args.n, args.repeats, args.batch)


if __name__ == "__main__":
    main()
