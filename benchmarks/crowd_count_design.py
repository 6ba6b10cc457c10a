"""The crowd count designed for a year: discrete Gaussian (chosen) against [ESA]'s discrete Laplace.

For a yearly budget epsilon_year = 1 (delta_year = 1e-6) over W = 365 daily windows and one or two charged
counts per window, prints each design's per-window parameters, its shift T (the mean number of reports the
shuffler deletes from every crowd), the deletions' standard deviation, and the count's composed cost after
W windows as the odometer computes it (PLD composition read at delta 1e-6 plus the infinite-loss mass).
The Laplace per-window epsilon is bisected on the same composition, with delta_cr = delta_year / (2 W) so
its top outcomes fit the same share of delta as the Gaussian's.

    .venv/bin/python benchmarks/crowd_count_design.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transforms.privacy.crowd import crowd_threshold, discrete_laplace_variance
from transforms.privacy.crowd_count import design, discrete_gaussian_variance
from transforms.privacy.odometer import WindowRelease, compose_with_delta

EPS_YEAR, DELTA_YEAR, DELTA = 1.0, 1e-6, 1e-6


def gaussian(windows: int, charges: int) -> dict:
    sigma, threshold = design(EPS_YEAR, DELTA_YEAR, windows, charges)
    only = WindowRelease(None, None, 0, approx_epsilon=0.0, approx_delta=0.0, count_sigma=sigma,
                         count_threshold=threshold, count_charges=charges)
    eps, delta, _ = compose_with_delta([only] * windows, DELTA)
    return {"sigma": round(sigma, 2), "T_mean_deletions": threshold,
            "sd_deletions": round(math.sqrt(discrete_gaussian_variance(sigma)), 1),
            "cost_after_year": round(eps, 4), "delta": delta}


def laplace(windows: int) -> dict:
    """Two counts per window (the only form the legacy Laplace PLD models)."""
    delta_cr = DELTA_YEAR / (2 * windows)

    def cost(eps_cr: float) -> tuple[float, float]:
        only = WindowRelease(None, None, 0, eps_cr, delta_cr, 0.0, 0.0)
        eps, delta, _ = compose_with_delta([only] * windows, DELTA)
        return eps, delta

    lo, hi = 1e-4, 1.0
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if cost(mid)[0] <= EPS_YEAR else (lo, mid)
    eps, delta = cost(lo)
    return {"eps_cr_per_window": round(lo, 5), "T_mean_deletions": round(crowd_threshold(lo, delta_cr)),
            "sd_deletions": round(math.sqrt(discrete_laplace_variance(lo)), 1), "cost_after_year": round(eps, 4),
            "delta": delta}


def main() -> None:
    out = {"gaussian, 365 windows, 2 counts": gaussian(365, 2), "gaussian, 365 windows, 1 count": gaussian(365, 1),
           "laplace, 365 windows, 2 counts": laplace(365), "gaussian, 8760 windows, 2 counts": gaussian(8760, 2)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
