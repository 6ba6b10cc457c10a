"""What an analysis reports: the named items of each kind, from a mechanism's decoded estimate.

Every kind becomes rows of (item, index, estimate, stderr, raw): the Estimate record's columns. ``raw`` is
the unbiased estimate; ``estimate`` is the post-processed one when the spec asks for post-processing
(``[postprocess] method``), which trades bias for lower error and keeps outputs in range (docs/mathematics.md
§2.9). ``stderr`` always describes the raw estimate: post-processing is data-dependent and has no
closed-form standard error.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from transforms.mechanisms.postprocess import postprocess
from transforms.spec import AnalysisSpec
from transforms.wire.event_values import from_input_range, kv_encoder


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

    return np.asarray(postprocess(method, values, total=total), dtype=np.float64)


def histogram_items(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Per-category frequencies (fractions of the clients analyzed)."""
    raw = np.asarray(result.frequency, dtype=np.float64)
    return _items(spec.categories, postprocessed(spec.postprocess, raw), result.stderr, raw)


def kv_items(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Per key: non-missing frequency, mean (normalised units, a missing key counting as the range middle)
    and conditional mean (value units). ``[postprocess] method = "simplex"`` projects f/s onto the simplex
    of the 2d items and multiplies back by s (docs/mathematics.md §2.9) before the per-key quantities are formed."""
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
    """Per coordinate: the mean in value units (a mechanism's own input range is mapped back)."""
    mean, stderr = from_input_range(spec, np.asarray(result.mean, dtype=np.float64),
                                    np.asarray(result.stderr, dtype=np.float64))
    return _items(spec.categories, mean, stderr, mean)


def tree_items(spec: AnalysisSpec, tree: Any) -> list[Item]:
    """Every node of the dyadic tree: ``estimate`` the consistent count, ``raw`` the unbiased one (what
    ``RangeTree.from_rows`` rebuilds the tree from), ``stderr`` the raw node's. Item ``"level/index"``
    (level = prefix length in bits, 0 = the root holding n)."""
    rows = tree.to_rows()
    consistent = {int(length): np.asarray(c, dtype=np.float64)
                  for length, c in zip(tree.prefix_lengths, tree.consistent, strict=True)}
    processed = [float(tree.n) if level == 0 else float(consistent[int(level)][int(index)])
                 for level, index in zip(rows["level"].tolist(), rows["index"].tolist(), strict=True)]
    names = [f"{level}/{index}" for level, index in zip(rows["level"].tolist(), rows["index"].tolist(), strict=True)]
    return _items(names, np.asarray(processed), rows["stderr"], rows["estimate"])


def leaf_value(spec: AnalysisSpec, leaf_edge: float) -> float:
    """A leaf boundary in value units (the spec's value_range split in 2^bits buckets), or the leaf itself."""
    value_range = spec.domain.get("value_range")
    if value_range is None:
        return float(leaf_edge)
    lo, hi = value_range
    return lo + (hi - lo) * float(leaf_edge) / 2 ** spec.domain["bits"]


def quantile_items(spec: AnalysisSpec, tree: Any) -> list[Item]:
    """The tree's nodes, then one row per spec quantile: the upper edge of the quantile's bucket in value
    units, with stderr = half the width of its z = 1.96 confidence interval / 1.96."""
    items = tree_items(spec, tree)
    z = 1.96
    for q in spec.domain["quantiles"]:
        answer = tree.quantile(q, z=z)
        value = leaf_value(spec, answer.leaf + 1)
        width = leaf_value(spec, answer.upper + 1) - leaf_value(spec, answer.lower)
        items.append(Item(f"quantile:{q:g}", len(items), value, width / (2 * z), value))
    return items


def heavy_hitter_items(spec: AnalysisSpec, result: Any) -> list[Item]:
    """The top items (as hex hashes: the analyzer never sees the strings) by estimated frequency."""
    top = spec.domain["top"]
    digits = (spec.domain["bits"] + 3) // 4
    n = max(int(result.n), 1)
    names = [f"{int(h):0{digits}x}" for h in np.asarray(result.items)[:top].tolist()]
    freq = np.asarray(result.count, dtype=np.float64)[:top] / n
    return _items(names, freq, np.asarray(result.stderr, dtype=np.float64)[:top] / n, freq)


def tree_parameters(spec: AnalysisSpec, tree: Any) -> dict[str, Any]:
    """Per-level constants a range tree needs to be rebuilt from its stored rows (``esa query``)."""
    rows = tree.to_rows()
    levels = {}
    for level in np.unique(rows["level"]).tolist():
        first = rows[rows["level"] == level][0]
        levels[str(level)] = [float(first[k]) for k in ("clients", "var_intercept", "var_slope", "cov_beta")]
    return {"bits": spec.domain["bits"], "value_range": spec.domain.get("value_range"), "levels": levels,
            "structure": tree.structure}


READOUTS = {"histogram": histogram_items, "kv_mean": kv_items, "vector_mean": vector_items, "range": tree_items,
            "quantile": quantile_items, "heavy_hitters": heavy_hitter_items}
READOUT_PARAMETERS = {"range": tree_parameters, "quantile": tree_parameters}


def readout_parameters(spec: AnalysisSpec, result: Any) -> dict[str, Any] | None:
    """What a stored reader needs beyond the rows (a range tree's per-level constants), or None."""
    fn = READOUT_PARAMETERS.get(spec.kind)
    return fn(spec, result) if fn else None


def readout(spec: AnalysisSpec, result: Any) -> list[Item]:
    """Rows of one crowd's estimate for the spec's analysis kind."""
    try:
        return READOUTS[spec.kind](spec, result)
    except KeyError:
        raise ValueError(f"no readout for analysis kind {spec.kind}") from None
