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


READOUTS = {"histogram": histogram_items}


def readout(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Rows of one crowd's estimate for the spec's analysis kind."""
    try:
        return READOUTS[spec.kind](spec, result)
    except KeyError:
        raise ValueError(f"no readout for analysis kind {spec.kind}") from None
