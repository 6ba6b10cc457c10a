"""What an analysis reports: the named items of each kind, from a mechanism's decoded estimate.

Every kind becomes rows of (item, index, estimate, stderr, raw): the Estimate record's columns. ``raw`` is
the unbiased estimate; ``estimate`` is the post-processed one when the spec asks for post-processing
(``[postprocess] method``), which trades bias for lower error and keeps outputs in range (MECHANISMS.md
§8.7). ``stderr`` always describes the raw estimate: post-processing is data-dependent and has no
closed-form standard error.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from transforms.spec import AnalysisSpec


class Item(NamedTuple):
    """One estimated quantity of one window."""

    name: str
    index: int
    estimate: float
    stderr: float
    raw: float


def _items(names: list[str] | tuple[str, ...], processed: np.ndarray, stderr: np.ndarray, raw: np.ndarray,
           offset: int = 0) -> list[Item]:
    return [Item(n, offset + i, float(p), float(s), float(r))
            for i, (n, p, s, r) in enumerate(zip(names, processed, stderr, raw, strict=True))]


def postprocessed(method: str, values: np.ndarray, total: float = 1.0) -> np.ndarray:
    """Apply the spec's post-processing to a frequency vector (``total``: what it sums to)."""
    if method == "none":
        return values
    from transforms.mechanisms.postprocess import postprocess

    return np.asarray(postprocess(method, values, total=total), dtype=np.float64)


def histogram_items(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Per-category frequencies (fractions of the clients analyzed)."""
    raw = np.asarray(result.frequency, dtype=np.float64)
    return _items(spec.categories, postprocessed(spec.postprocess, raw), result.stderr, raw)


def kv_items(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Per key: non-missing frequency, mean (normalised units, a missing key counting as the range middle)
    and conditional mean (value units). ``[postprocess] method = "simplex"`` projects f/s onto the simplex
    of the 2d items and multiplies back by s (MECHANISMS.md §8.7) before the per-key quantities are formed."""
    from transforms.event_values import kv_encoder

    s = spec.domain["s"]
    freq = np.asarray(result.frequency, dtype=np.float64)
    proc = postprocessed(spec.postprocess, freq / s) * s if spec.postprocess != "none" else freq
    plus, minus = proc[1::2], proc[0::2]
    mean, nonmissing = plus - minus, plus + minus
    with np.errstate(divide="ignore", invalid="ignore"):
        conditional = np.where(nonmissing > 0, mean / nonmissing, np.nan)
    encoder = kv_encoder(spec)
    cond_value, _ = encoder.denormalise(conditional)
    raw_cond, cond_se = encoder.denormalise(result.conditional_mean, result.conditional_mean_stderr)
    keys = spec.categories
    d = len(keys)
    return (_items([f"{k}:frequency" for k in keys], nonmissing, result.nonmissing_stderr, result.nonmissing)
            + _items([f"{k}:mean" for k in keys], mean, result.mean_stderr, result.mean, offset=d)
            + _items([f"{k}:conditional_mean" for k in keys], cond_value, cond_se, raw_cond, offset=2 * d))


def vector_items(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Per coordinate: the mean in value units (002's [0, 1] sums are mapped back to the value range)."""
    mean, stderr = np.asarray(result.mean, dtype=np.float64), np.asarray(result.stderr, dtype=np.float64)
    if spec.mechanism == "vector_sum":
        lo, hi = spec.domain["value_range"]
        mean, stderr = lo + (hi - lo) * mean, (hi - lo) * stderr
    return _items(spec.categories, mean, stderr, mean)


READOUTS = {"histogram": histogram_items, "kv_mean": kv_items, "vector_mean": vector_items}


def readout(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Rows of one crowd's estimate for the spec's analysis kind."""
    try:
        return READOUTS[spec.kind](spec, result)
    except KeyError:
        raise ValueError(f"no readout for analysis kind {spec.kind}") from None
