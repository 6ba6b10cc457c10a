"""Peak memory and CPU time of one window's accounting in the analyzer (odometer add: the window's PLD).

Run once per size in a fresh process (peak RSS is per process): README's demo mechanism (OLH, d = 64, eps = 2),
total delta 1e-6, the finest loss grid (1e-5, what the analyzer uses for windows of eps_central below 0.01).

    .venv/bin/python benchmarks/accounting_memory.py 100000
    .venv/bin/python benchmarks/accounting_memory.py 1000000
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transforms.mechanisms.frequency.olh import OLH
from transforms.privacy.odometer import PrivacyOdometer, WindowRelease


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 100_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mech = OLH(64, 2.0)
    dec = mech.blanket_decomposition()
    start = time.process_time()
    odometer = PrivacyOdometer(1e-6, 1e-5)
    eps = odometer.add(WindowRelease(mech.mixture_alpha, mech.epsilon_local, n,
                                     blanket=None if dec is None else dec.as_tuple()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"n={n} eps={eps:.5f} cpu={time.process_time() - start:.2f}s rss_after_imports={before:.0f}MB "
          f"peak={peak:.0f}MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
