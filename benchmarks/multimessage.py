"""Cost and throughput of the [MultiMsg] multi-message protocols (docs/mathematics.md §7.1, §7.2).

For each protocol and d in {2^10, 2^16}, n in {1e4, 1e5}, eps in {1, 4} (delta = 1e-6, numeric calibration)
prints the parameters the accountant chose, messages and bytes per client (packed bits and the Avro payload
size of the wire format), the certified central epsilon, the predicted standard error of a count, and the
throughput of encode and decode (accumulate) in messages/s and clients/s. Single thread (BLAS pools pinned
to 1 before numpy loads). Throughput is measured on a sample of clients (at most ``--max-messages`` messages):
count-min at eps = 1 sends tens of thousands of messages per client, so encoding all n clients is not the point.

    .venv/bin/python benchmarks/multimessage.py            # all 16 configurations
    .venv/bin/python benchmarks/multimessage.py --quick    # smaller samples
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.mechanisms.multimessage.protocols import CountMinMultiRR, MultiMessageHadamard  # noqa: E402

Mech = MultiMessageHadamard | CountMinMultiRR
DELTA = 1e-6


def varint_bytes(value: int) -> int:
    """Bytes of Avro's zig-zag varint encoding of a non-negative long."""
    return max(1, math.ceil((2 * value).bit_length() / 7))


def avro_payload_bytes(mech: Mech) -> int:
    """Worst-case Avro payload bytes of one message (the union branch index included)."""
    if isinstance(mech, MultiMessageHadamard):  # IntegersPayload: block count, tau longs, end marker
        return 1 + varint_bytes(mech.tau_) + mech.tau_ * varint_bytes(mech.order - 1) + 1
    return 1 + varint_bytes(mech.rows_ - 1) + varint_bytes(mech.buckets_ - 1)  # HashedPayload (seed=row, z)


def build(kind: str, d: int, n: int, eps: float) -> tuple[Mech, float]:
    t0 = time.perf_counter()
    mech: Mech = (MultiMessageHadamard(d, eps, DELTA, n_expected=n) if kind == "hadamard"
                  else CountMinMultiRR(d, eps, DELTA, n_expected=n))
    return mech, time.perf_counter() - t0


def predicted_stderr(mech: Mech, n: int) -> float:
    """Standard error of one count (Hadamard: exact at x_j = 0; count-min: collision-free)."""
    return float(np.sqrt(mech.variance(np.zeros(1), n))[0])


def throughput(mech: Mech, n: int, max_messages: int, seed: int) -> tuple[int, float, float, float, float]:
    """(clients sampled, encode msgs/s, encode clients/s, decode msgs/s, estimate seconds)."""
    per_client = mech.ledger(n)["messages_per_client_expected"]
    clients = int(max(1, min(n, max_messages // max(1.0, per_client))))
    rng = np.random.default_rng(seed)  # a simulation: seeded on purpose
    w = 1.0 / np.arange(1, mech.d + 1) ** 1.1
    values = rng.choice(mech.d, size=clients, p=w / w.sum())
    batch = max(1, int(200_000 // max(1.0, per_client)))
    t0 = time.perf_counter()
    parts = [mech.encode_messages(values[s : s + batch], rng) for s in range(0, clients, batch)]
    t_enc = time.perf_counter() - t0
    reports = np.concatenate([p[0] for p in parts])
    acc = mech.new_accumulator()
    t0 = time.perf_counter()
    for start in range(0, len(reports), 1 << 18):
        acc.add(reports[start : start + (1 << 18)], 0)
    t_dec = time.perf_counter() - t0
    acc.n = clients
    t0 = time.perf_counter()
    acc.estimate()
    t_est = time.perf_counter() - t0
    return clients, len(reports) / t_enc, clients / t_enc, len(reports) / t_dec, t_est


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sample at most 300k messages per configuration")
    parser.add_argument("--max-messages", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    max_messages = 300_000 if args.quick else args.max_messages
    header = (f"{'protocol':<9} {'d':>6} {'n':>7} {'eps':>3} | {'params':<26} {'msgs/cl':>9} {'max':>7} "
              f"{'bits':>4} {'B/cl pk':>9} {'B/cl avro':>10} {'eps_c':>6} {'se':>6} | {'calib s':>7} "
              f"{'enc msg/s':>10} {'enc cl/s':>9} {'dec msg/s':>10} {'est s':>6}")
    print(f"delta = {DELTA:g}, numeric calibration; throughput on <= {max_messages:,} messages per row")
    print(header)
    print("-" * len(header))
    for kind in ("hadamard", "countmin"):
        for d in (2**10, 2**16):
            for n in (10**4, 10**5):
                for eps in (1.0, 4.0):
                    mech, t_cal = build(kind, d, n, eps)
                    led = mech.ledger(n)
                    params = (f"rho={mech.rho_} tau={mech.tau_}" if isinstance(mech, MultiMessageHadamard)
                              else f"g={mech.gamma_:.2e} t={mech.rows_} s={mech.buckets_}")
                    per = led["messages_per_client_expected"]
                    avro = per * avro_payload_bytes(mech)
                    _, enc, enc_cl, dec, est = throughput(mech, n, max_messages, args.seed)
                    print(f"{kind:<9} {d:>6} {n:>7} {eps:>3.0f} | {params:<26} {per:>9.1f} "
                          f"{led['messages_per_client_max']:>7} {led['bits_per_message']:>4} "
                          f"{led['bytes_per_client_expected']:>9.0f} {avro:>10.0f} {led['epsilon_numeric']:>6.3f} "
                          f"{predicted_stderr(mech, n):>6.1f} | {t_cal:>7.2f} {enc:>10.3g} {enc_cl:>9.3g} "
                          f"{dec:>10.3g} {est:>6.3f}", flush=True)
    print("\nmsgs/cl: expected messages per client (max: the shuffler's flood quota); B/cl pk: bytes per client with "
          "messages packed to their bit length; B/cl avro: payload bytes on the wire (Avro varints); eps_c: "
          "certified central epsilon at n; se: standard error of one count; est s: decode of the count arrays.")


if __name__ == "__main__":
    main()
