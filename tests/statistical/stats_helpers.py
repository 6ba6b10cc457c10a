"""Monte-Carlo checks shared by the statistical tests (Monte-Carlo mean and variance against the closed
forms of docs/mathematics.md).

R independent runs give an ``[R, k]`` array of estimates. Two checks against closed forms:

* **mean**: per coordinate, ``z = (mean_r est - centre) / sqrt(var / R)``; ``max |z| < Z_MAX`` (4.5 sigma,
  Bonferroni over the few dozen coordinates a test looks at: ``P(max |z| > 4.5) < k * 6.8e-6``).
* **summed variance**: ``t_r = ||est_r - centre||^2`` are i.i.d. with mean ``sum var``; their sample mean has
  the CLT standard error ``std(t_r)/sqrt(R)``, which accounts for correlations between coordinates that a
  per-coordinate rule would ignore. We allow SE_MAX = 4 such standard errors and also require that standard
  error to be small against the expectation, so that a wrong closed form (by ~20-25 %) would be seen.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "SE_MAX",
    "Z_MAX",
    "assert_mean",
    "assert_mean_and_variance",
    "assert_summed_variance",
    "lumpy_leaves",
    "zipf_counts",
]

Z_MAX = 4.5
SE_MAX = 4.0


def zipf_counts(d: int, n: int, s: float = 1.1) -> np.ndarray:
    """Deterministic Zipf-like true counts summing to n (every item present, heavy head)."""
    w = 1.0 / np.arange(1, d + 1) ** s
    c = np.floor(n * w / w.sum()).astype(np.int64)
    c[0] += n - c.sum()
    return c


def lumpy_leaves(bits: int, n: int, seed: int) -> np.ndarray:
    """A skewed, lumpy leaf distribution over [0, 2^bits) (two bumps and a long tail), fixed per seed."""
    rng = np.random.default_rng(seed)
    size = 1 << bits
    parts = [rng.normal(0.3 * size, 0.05 * size, n // 2), rng.normal(0.7 * size, 0.02 * size, n // 4),
             rng.exponential(0.2 * size, n - n // 2 - n // 4)]
    return np.clip(np.concatenate(parts), 0, size - 1).astype(np.int64)


def assert_mean(est: np.ndarray, centre: np.ndarray, var: np.ndarray, label: str = "") -> None:
    """Every coordinate's run mean within Z_MAX standard errors of ``centre`` (``var``: one run's variance)."""
    z = (est.mean(axis=0) - centre) / np.sqrt(np.asarray(var) / est.shape[0])
    assert np.max(np.abs(z)) < Z_MAX, f"{label}: max |z| = {np.max(np.abs(z)):.2f}"


def assert_summed_variance(est: np.ndarray, centre: np.ndarray, expected: float, label: str = "",
                           sharpness: float = 0.06) -> float:
    """Mean of ``||est_r - centre||^2`` within SE_MAX CLT standard errors of ``expected`` (the summed variance),
    with that standard error below ``sharpness * expected``. Returns the standard error."""
    t = np.sum((est - centre) ** 2, axis=1)
    se = float(np.std(t, ddof=1) / np.sqrt(len(t)))
    expected = float(expected)
    assert abs(t.mean() - expected) < SE_MAX * se, (
        f"{label}: summed variance {t.mean():.4g} vs closed form {expected:.4g} (se {se:.3g})"
    )
    assert se < sharpness * expected, f"{label}: se {se:.3g} too large to test the closed form"
    return se


def assert_mean_and_variance(label: str, est: np.ndarray, centre: np.ndarray, var: np.ndarray) -> None:
    """Both checks: per-coordinate means, then the summed variance (sharp enough to see a 25% error)."""
    assert_mean(est, centre, var, label)
    assert_summed_variance(est, centre, float(np.sum(var)), label)
