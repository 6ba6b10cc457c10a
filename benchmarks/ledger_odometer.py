"""The analyzer's per-release cost after 100 and after 1,000 windows of one population.

Runs ``transforms.analyzer.release_step.write_release`` (seal in the ledger, odometer, Parquet part: the driver's whole
per-release path, on a real state directory) for W daily windows of README's demo setting (OLH eps = 2,
d = 64, n ~ 50,000 wandering by a few percent) and reports the mean seconds per release over the first 100
and over 1,000 windows, with and without a claimed (charged) crowd count. Issue 26's target: 1,000 windows
in under 3x the per-window time of 100. The odometer's own work per release is one self-composition of the
changed group plus one composition per tree node above it (counted in tests/privacy/test_ledger_odometer.py).

    .venv/bin/python benchmarks/ledger_odometer.py [--windows 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.privacy.test_ledger_odometer import Analyzer, N, _spec


def run(windows: int, claim: bool) -> list[float]:
    spec = _spec(membership=True) if claim else _spec()
    with tempfile.TemporaryDirectory() as root:
        analyzer = Analyzer(Path(root), [spec])
        times = []
        for day in range(windows):
            started = time.perf_counter()
            analyzer.release(spec, day, N + 500 * ((7 * day) % 5))
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1000)
    args = parser.parse_args()
    out = {}
    for claim in (False, True):
        times = run(args.windows, claim)
        first, whole = sum(times[:100]) / 100, sum(times) / len(times)
        last = sum(times[-100:]) / 100
        out["membership count" if claim else "replacement"] = {
            "per_release_first_100_s": round(first, 4), f"per_release_all_{args.windows}_s": round(whole, 4),
            "per_release_last_100_s": round(last, 4), "ratio_all_to_first_100": round(whole / first, 2)}
        print(json.dumps(out, indent=2), flush=True)


if __name__ == "__main__":
    main()
