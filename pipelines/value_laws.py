"""Synthetic values of the numeric analysis kinds and their exact truths (see ``pipelines.population``).

Each law draws raw values as a device would hold them; each truth computes, from those very values, what
the analyzer's Estimate rows estimate, with the same item names and indices as ``transforms.readout``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transforms.spec import AnalysisSpec


def kv_values(spec: AnalysisSpec, n: int, rng: np.random.Generator, law: Any) -> list[dict[str, float]]:
    """Each client holds 1..s keys (popular keys by Zipf rank) with values around a key-specific mean.

    Key j's values are Beta-distributed on the value range with mean ``lo + (hi - lo) * m_j``, m_j spread
    over (0.15, 0.85), so conditional means differ visibly from key to key.
    """
    keys, s = spec.categories, spec.domain["s"]
    lo, hi = spec.domain["value_range"]
    d = len(keys)
    popularity = 1.0 / np.arange(1, d + 1) ** (law.zipf_s if law.distribution == "zipf" else 0.0)
    popularity /= popularity.sum()
    centre = 0.15 + 0.7 * (np.arange(d) * 0.618034 % 1.0)  # golden-ratio spread of the per-key means
    sizes = rng.integers(1, s + 1, size=n)
    # s distinct keys per client by weighted sampling without replacement (Gumbel top-k), keep the first size
    gumbel = np.log(popularity)[None, :] - np.log(-np.log(rng.random((n, d))))
    chosen = np.argsort(-gumbel, axis=1)[:, :s]
    concentration = 8.0
    draws = rng.beta(centre[chosen] * concentration, (1 - centre[chosen]) * concentration)
    values = lo + (hi - lo) * draws
    return [{keys[k]: float(v) for k, v in zip(chosen[i, :sizes[i]], values[i, :sizes[i]], strict=True)}
            for i in range(n)]


def kv_truth(spec: AnalysisSpec, values: list[dict[str, float]]) -> dict[str, np.ndarray]:
    """Per key: fraction of clients holding it, mean of the normalised value (missing = 0, the range
    middle) and conditional mean in value units -- the three item groups of the kv_mean readout."""
    keys = spec.categories
    d, n = len(keys), len(values)
    lo, hi = spec.domain["value_range"]
    index = {k: j for j, k in enumerate(keys)}
    held = np.zeros(d)
    u_sum = np.zeros(d)
    v_sum = np.zeros(d)
    for event in values:
        for key, value in event.items():
            j = index[key]
            held[j] += 1
            u_sum[j] += 2 * (value - lo) / (hi - lo) - 1
            v_sum[j] += value
    with np.errstate(invalid="ignore", divide="ignore"):
        conditional = np.where(held > 0, v_sum / held, np.nan)
    items = [f"{k}:frequency" for k in keys] + [f"{k}:mean" for k in keys] + [f"{k}:conditional_mean" for k in keys]
    return {"item": np.asarray(items, dtype=object),
            "truth": np.concatenate([held / n, u_sum / n, conditional])}


def vector_values(spec: AnalysisSpec, n: int, rng: np.random.Generator, law: Any) -> np.ndarray:
    """Vectors with coordinate j Beta-distributed around a coordinate-specific mean on the value range."""
    d = spec.d
    lo, hi = spec.domain["value_range"]
    centre = 0.1 + 0.8 * (np.arange(d) * 0.618034 % 1.0)
    return lo + (hi - lo) * rng.beta(centre * 5.0, (1 - centre) * 5.0, size=(n, d))


def vector_truth(spec: AnalysisSpec, values: np.ndarray) -> dict[str, np.ndarray]:
    """The exact mean vector of the clients."""
    return {"item": np.asarray(spec.categories, dtype=object), "truth": np.asarray(values).mean(axis=0)}
