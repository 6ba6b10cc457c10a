"""The odometer's cost per release when windows are small: 1,000 releases of n = 40..100 (61 size groups).

Each release is added to a running ``PrivacyOdometer`` and the cumulative epsilon is read (what the analyzer
does per release). Prints the mean CPU seconds per release over the first 100 and the last 100 releases and
their ratio (issue: at most 1.5x), with the final epsilon. README's demo mechanism (OLH, d = 64, eps = 2),
total delta 1e-6, the analyzer's grid (``interval_for``); sizes drawn with a fixed seed.

    .venv/bin/python benchmarks/odometer_small_windows.py [--releases 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transforms.mechanisms.frequency.olh import OLH
from transforms.privacy.odometer import PrivacyOdometer, WindowRelease, interval_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=1000)
    args = parser.parse_args(argv)
    mech = OLH(64, 2.0)
    dec = mech.blanket_decomposition()
    sizes = np.random.default_rng(20261202).integers(40, 101, args.releases)
    odometer = PrivacyOdometer(1e-6, interval_for(2.0))
    seconds = []
    for n in sizes.tolist():
        release = WindowRelease(mech.mixture_alpha, mech.epsilon_local, n,
                                blanket=None if dec is None else dec.as_tuple())
        start = time.process_time()
        epsilon = odometer.add(release)
        seconds.append(time.process_time() - start)
    first, last = float(np.mean(seconds[:100])), float(np.mean(seconds[-100:]))
    print(json.dumps({"releases": args.releases, "groups": len({int(n) for n in sizes}),
                      "first_100_s_per_release": round(first, 5), "last_100_s_per_release": round(last, 5),
                      "ratio": round(last / first, 2), "epsilon": round(epsilon, 4),
                      "compositions": odometer.compositions}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
