"""Device-side throughput: ``Client.encode`` calls per second on one core, signing and sealing included.

One report = randomize (the spec's mechanism on a batch of one), seal every message to the analyzer (X25519 +
HKDF + ChaCha20-Poly1305 per message), sign the message set (Ed25519) and encode it as Avro. Two settings:

* ``no budget``: nothing persistent except, for ``rappor_fragments``, the memoized backstop (read under the
  state lock on every report);
* ``budget``: the ledger is read and atomically rewritten (temporary file, fsync, rename, fsync of the
  directory) before each report is returned -- on a phone the fsyncs dominate, as here.

Specs: histograms over d = ``--d`` categories; grr and olh at eps = 2, attribute-fragmented k-RAPPOR
(``rappor``) at eps = 4, report fragmenting (``rappor_fragments``) at eps_b = 4 with tau = 4. Values are
drawn from a Zipf(1.1) histogram. Prints the median over ``--repeats`` runs of ``--reports`` encodes each, as
encodes per CPU-second of this process (``cpu``: per core, robust on a shared machine) and per wall-clock second
(``wall``: includes waiting for fsync, which is what bounds the budgeted client).

    .venv/bin/python benchmarks/device.py            # ~1 minute
    .venv/bin/python benchmarks/device.py --quick
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from benchmarks.frequency import zipf_values  # noqa: E402
from transforms.device import Budget, Client  # noqa: E402
from transforms.spec import AnalysisSpec, spec_from_dict  # noqa: E402
from transforms.trust.envelope import open_envelope  # noqa: E402
from transforms.trust.message_set import decode_message_set  # noqa: E402

CASES: dict[str, tuple[float, dict[str, Any]]] = {
    "grr": (2.0, {}),
    "olh": (2.0, {}),
    "rappor": (4.0, {}),
    "rappor_fragments": (4.0, {"fragments": 4}),
}


def spec_of(mechanism: str, d: int) -> AnalysisSpec:
    eps, params = CASES[mechanism]
    return spec_from_dict({"analysis": {"name": f"bench_{mechanism}", "kind": "histogram"}, "domain": {"size": d},
                           "mechanism": {"name": mechanism, "epsilon": eps, **params}})


def bench(mechanism: str, d: int, reports: int, repeats: int, budget: bool,
          state: Path) -> tuple[float, float, float, float]:
    """(encodes per CPU second, per wall second, mean messages per report, mean bytes per report)."""
    analyzer = X25519PrivateKey.generate().public_key()
    shuffler = X25519PrivateKey.generate()
    client = Client(spec_of(mechanism, d), state, analyzer_public_key=analyzer, analyzer_key_id="20260101-00000000",
                    shuffler_public_key=shuffler.public_key(), shuffler_key_id="20260101-00000001",
                    budget=Budget(1e12) if budget else None)
    values = zipf_values(reports, d, np.random.default_rng(1)).tolist()
    client.encode(values[0])  # warm caches (schemas, mechanism caps) outside the timing
    out: list[bytes] = []

    cpu, wall = [], []
    for _ in range(repeats):
        out.clear()
        c0, w0 = time.process_time(), time.perf_counter()
        out.extend(client.encode(v) for v in values)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    keys = {"20260101-00000001": shuffler}
    messages = float(np.mean([len(decode_message_set(open_envelope(keys, b)).messages) for b in out]))
    return (reports / statistics.median(cpu), reports / statistics.median(wall), messages,
            float(np.mean([len(b) for b in out])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--reports", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100 reports, 1 repeat")
    args = parser.parse_args()
    reports, repeats = (100, 1) if args.quick else (args.reports, args.repeats)
    print(f"Client.encode on one core, d = {args.d}, {reports} reports x {repeats} repeats (median)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'':<18}{'':>12}{'':>14}{'encodes/s, no budget':>24}{'encodes/s, budget':>22}")
    print(f"{'mechanism':<18}{'msgs/report':>12}{'bytes/report':>14}{'cpu':>12}{'wall':>12}{'cpu':>11}{'wall':>11}")
    for mechanism in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            free_cpu, free_wall, messages, size = bench(mechanism, args.d, reports, repeats, False, Path(tmp) / "a")
            paid_cpu, paid_wall, _, _ = bench(mechanism, args.d, reports, repeats, True, Path(tmp) / "b")
        print(f"{mechanism:<18}{messages:>12.1f}{size:>14.0f}{free_cpu:>12.0f}{free_wall:>12.0f}{paid_cpu:>11.0f}"
              f"{paid_wall:>11.0f}")


if __name__ == "__main__":
    main()
