"""Post-processing of frequency estimates (docs/mathematics.md §2.9): free for privacy, trades bias for error.

The unbiased estimators return negative frequencies and totals off by noise. Any function of the released
estimate keeps its DP guarantee, so an analyst may ask for

* ``"none"``: the unbiased estimate as decoded (what the standard errors describe);
* ``"clip"``: negatives set to 0, optionally rescaled to a total (``clip_nonnegative``);
* ``"simplex"``: the Euclidean projection onto ``{x >= 0, sum x = total}`` (``project_simplex``), the closest
  consistent histogram; it lowers the l2 error whenever the truth lies on that simplex.

Both non-trivial options are biased: the standard errors of the unbiased estimate no longer describe them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from transforms.mechanisms.base import FrequencyEstimate

__all__ = ["POSTPROCESSORS", "clip_nonnegative", "postprocess", "project_simplex"]

POSTPROCESSORS = ("none", "clip", "simplex")


def _as_finite(v: np.ndarray | list[float]) -> np.ndarray:
    arr = np.asarray(v, dtype=np.float64)
    if arr.ndim < 1 or arr.shape[-1] == 0:
        raise ValueError(f"expected a non-empty vector (or a stack of them, last axis), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("estimate contains NaN or infinite entries; post-processing needs finite numbers")
    return arr


def _check_total(total: float) -> float:
    if not np.isfinite(total) or total <= 0:
        raise ValueError(f"total must be a finite number > 0, got {total!r}")
    return float(total)


def project_simplex(v: np.ndarray | list[float], total: float = 1.0) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{x >= 0, sum x = total}`` (Wang & Carreira-Perpinan 2013), O(D log D).

    Sort descending, ``rho`` = the largest j with ``u_j + (total - cumsum_j)/j > 0``, shift everything by
    ``lam = (total - cumsum_rho)/rho`` and clip at 0. Works along the last axis of a stack of vectors.
    """
    z = _check_total(total)
    # The projection commutes with shifting every entry by a constant: shifting the maximum to 0 makes the
    # j = 1 test read ``z > 0`` exactly and keeps lam of the order of z even for huge inputs.
    y = _as_finite(v)
    y = y - y.max(axis=-1, keepdims=True)
    u = -np.sort(-y, axis=-1)
    cs = np.cumsum(u, axis=-1)
    j = np.arange(1, y.shape[-1] + 1, dtype=np.float64)
    positive = u + (z - cs) / j > 0  # a prefix in exact arithmetic, always true at j = 1
    rho = y.shape[-1] - np.argmax(positive[..., ::-1], axis=-1)  # largest true j (robust to rounding)
    lam = (z - np.take_along_axis(cs, rho[..., None] - 1, axis=-1)) / rho[..., None]
    return np.maximum(y + lam, 0.0)


def clip_nonnegative(v: np.ndarray | list[float], total: float | None = None) -> np.ndarray:
    """Set negative entries to 0; with ``total``, rescale the result to sum to it.

    If nothing positive is left there is no shape to rescale: ``total`` is then spread uniformly (the
    estimate carried no usable signal). Works along the last axis of a stack of vectors.
    """
    x = np.maximum(_as_finite(v), 0.0)
    if total is None:
        return x
    z = _check_total(total)
    s = x.sum(axis=-1, keepdims=True)
    uniform = np.full_like(x, z / x.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, x * (z / s), uniform)


def postprocess(
    name: str, estimate: np.ndarray | FrequencyEstimate, total: float | None = None
) -> np.ndarray | FrequencyEstimate:
    """Apply the post-processing ``name`` ("none", "clip" or "simplex") to frequencies.

    ``estimate`` is a frequency vector (or a stack) or a :class:`FrequencyEstimate`, whose ``frequency`` is
    processed and ``count`` recomputed as ``frequency * n`` (``stderr`` is kept: it is the unbiased
    estimate's, recorded with ``extras["postprocess"]``). ``total`` defaults to 1 for "simplex" and to no
    rescaling for "clip".
    """
    key = str(name).lower()
    if key not in POSTPROCESSORS:
        raise ValueError(f"unknown post-processing {name!r}; valid names: {', '.join(POSTPROCESSORS)}")
    if isinstance(estimate, FrequencyEstimate):
        frequency = postprocess(key, estimate.frequency, total)
        assert isinstance(frequency, np.ndarray)
        extras = {**estimate.extras, "postprocess": key}
        return replace(estimate, frequency=frequency, count=frequency * estimate.n, extras=extras)
    if key == "none":
        return _as_finite(estimate).copy()
    if key == "clip":
        return clip_nonnegative(estimate, total)
    return project_simplex(estimate, 1.0 if total is None else total)
