"""Calibration of the stated errors of every frequency oracle, over re-randomisations of a fixed dataset.

For each oracle R runs encode the same Zipf-like population with fresh randomness (fixed seed), decode it
through the real accumulator, and compare with the truth: the summed squared error over the summed stated
variance (stderr^2, the plug-in the analyzer publishes) must lie in [0.9, 1.1], and the share of items
within +-1.96 stated stderr in [93%, 97%]. With R d >= 2,400 (item, run) pairs the coverage has a standard
error below 0.45 points, so the window is > 4 standard errors wide around 95% for a calibrated oracle and a
1.2x understatement of the variance (coverage ~92%) fails. "Small and large d/S" exercises the hashed
oracles where the finite family matters (OLH: d/(S(g-1)) = 1/3 was 1.5x understated before the fix).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import zipf_counts
from transforms.mechanisms.frequency.count_mean_sketch import CountMeanSketch
from transforms.mechanisms.frequency.hadamard import HadamardResponse
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

CASES = [  # (mechanism, n, runs)
    (GRR(8, 1.0), 4000, 300),
    (GRR(128, 3.0), 20000, 25),
    (OUE(16, 1.0), 3000, 150),
    (OUE(128, 2.0), 4000, 20),
    (OLH(16, 1.0, seed_family=2**14), 4000, 150),  # d/(S(g-1)) ~ 3e-4
    (OLH(64, 1.0, seed_family=64), 4000, 40),      # d/(S(g-1)) = 1/3
    (OLH(256, 1.0, seed_family=256), 8000, 10),    # d/(S(g-1)) = 1/3, the d = S regime
    (HadamardResponse(16, 1.0), 4000, 150),
    (HadamardResponse(200, 2.0), 10000, 12),
    (CountMeanSketch(16, 2.0), 4000, 150),                # d/m = 1/64
    (CountMeanSketch(256, 2.0, k=64, m=64), 8000, 10),   # d/m = 4
    (AttributeFragmentedRappor(16, 1.0), 4000, 150),
    (AttributeFragmentedRappor(128, 2.0), 4000, 20),
]


def _run(mech, values: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    acc = mech.new_accumulator()
    if hasattr(mech, "encode_messages"):
        reports, _ = mech.encode_messages(values, rng)
        acc.add(reports, values.size)
    else:
        acc.add(mech.encode(values, rng))
    out = acc.estimate()
    return np.asarray(out.count, dtype=float), np.asarray(out.stderr, dtype=float) * values.size


@pytest.mark.parametrize(("mech", "n", "runs"), CASES, ids=[repr(c[0])[:60] for c in CASES])
def test_stated_errors_are_calibrated(mech, n: int, runs: int) -> None:
    counts = zipf_counts(mech.d, n)
    values = np.repeat(np.arange(mech.d), counts)
    rng = seeded_rng(7_000 + mech.d + n)
    err, se = np.empty((runs, mech.d)), np.empty((runs, mech.d))
    for r in range(runs):
        est, se[r] = _run(mech, values, rng)
        err[r] = est - counts
    ratio = float(np.sum(err**2) / np.sum(se**2))
    coverage = float(np.mean(np.abs(err) <= 1.96 * se))
    assert 0.9 <= ratio <= 1.1, f"empirical / stated variance {ratio:.3f}"
    assert 0.93 <= coverage <= 0.97, f"coverage of +-1.96 se {coverage:.3f}"
