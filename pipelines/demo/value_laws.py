"""Synthetic values of the numeric analysis kinds and their exact truths (see ``pipelines.demo.population``).

Each law draws raw values as a device would hold them; each truth computes, from those very values, what
the analyzer's Estimate rows estimate, with the same item names and indices as ``transforms.analyzer.readout``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transforms.analyzer.readout import leaf_value
from transforms.mechanisms.heavy_hitters.prefix_tree import item_hash
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
    """Vectors with coordinate j Beta-distributed around a coordinate-specific mean on the value range, inside
    the mechanism's input domain (``l2_shrink``: an L2-bounded mechanism such as ldp_sgd would clip others)."""
    d = spec.d
    lo, hi = spec.domain["value_range"]
    centre = 0.1 + 0.8 * (np.arange(d) * 0.618034 % 1.0)
    values = lo + (hi - lo) * rng.beta(centre * 5.0, (1 - centre) * 5.0, size=(n, d))
    shrink = l2_shrink(spec)
    if shrink is None:
        return values
    anchor, factor = shrink
    return anchor + factor * (values - anchor)


def l2_shrink(spec: AnalysisSpec) -> tuple[np.ndarray, float] | None:
    """(anchor, factor) such that ``anchor + factor (v - anchor)`` keeps every vector v of the value box inside
    the L2 ball of radius ``clip`` of an L2-bounded mechanism (ldp_sgd clips longer vectors, which biases its
    mean); None when the mechanism has no L2 bound or the whole box fits. The anchor is the box's point
    nearest the origin, so shrunk vectors stay in the value range. ValueError when no vector of the box fits.
    """
    mechanism = spec.randomizer
    clip = mechanism.clip
    if clip is None or mechanism.input_range is not None:
        return None
    lo, hi = spec.domain["value_range"]
    d = spec.d
    anchor = np.full(d, min(max(0.0, lo), hi))
    near = float(np.linalg.norm(anchor))
    far = float(np.sqrt(d) * max(abs(lo - anchor[0]), abs(hi - anchor[0])))  # farthest corner from the anchor
    if near >= clip:
        raise ValueError(f"{mechanism.name} takes vectors of L2 norm <= clip = {clip:g}, but no vector of the value "
                         f"range {[lo, hi]}^{d} is that short: use vector_sum, or a value_range around 0")
    if near + far <= clip:
        return None
    return anchor, (clip - near) / far


def vector_truth(spec: AnalysisSpec, values: np.ndarray) -> dict[str, np.ndarray]:
    """The exact mean vector of the clients."""
    return {"item": np.asarray(spec.categories, dtype=object), "truth": np.asarray(values).mean(axis=0)}


# -- range / quantile: latency-like numbers on the value range ---------------------------------------------


def _unit_to_domain(spec: AnalysisSpec, u: np.ndarray) -> np.ndarray:
    """Map fractions of the domain in [0, 1] to values: the value_range, or integer leaves without one."""
    value_range = spec.domain.get("value_range")
    if value_range is None:
        size = 2 ** spec.domain["bits"]
        return np.minimum(np.floor(u * size), size - 1).astype(np.int64)
    lo, hi = value_range
    return lo + (hi - lo) * u


def latency_values(spec: AnalysisSpec, n: int, rng: np.random.Generator, law: Any) -> np.ndarray:
    """Request-latency-like numbers: a fast log-normal mode, a gamma body and a slow log-normal tail.

    In fractions of the domain (x 2000 ms for the examples): 70 % log-normal with median 0.04 (80 ms),
    25 % gamma of mean 0.12 (240 ms), 5 % log-normal with median 0.45 (900 ms), clipped to the domain, so
    quantiles from the median to the 99th percentile spread over a decade. ``uniform`` draws uniformly.
    """
    if law.distribution == "uniform":
        return _unit_to_domain(spec, rng.random(n))
    component = rng.choice(3, size=n, p=[0.70, 0.25, 0.05])
    fast = np.exp(np.log(0.04) + 0.45 * rng.standard_normal(n))
    body = rng.gamma(3.0, 0.04, size=n)
    slow = np.exp(np.log(0.45) + 0.35 * rng.standard_normal(n))
    u = np.choose(component, [fast, body, slow])
    return _unit_to_domain(spec, np.clip(u, 0.0, 1.0))


def leaves_of(spec: AnalysisSpec, values: np.ndarray) -> np.ndarray:
    """Leaf of every value, exactly as ``transforms.wire.event_values.ordered_value`` buckets one event."""
    size = 2 ** spec.domain["bits"]
    x = np.asarray(values, dtype=np.float64)
    value_range = spec.domain.get("value_range")
    if value_range is None:
        return x.astype(np.int64)
    lo, hi = value_range
    return np.minimum(((x - lo) / (hi - lo) * size).astype(np.int64), size - 1)


def tree_truth(spec: AnalysisSpec, values: np.ndarray) -> dict[str, np.ndarray]:
    """The exact count of every node of the spec's tree: root "0/0" (n), then level by level, as
    ``RangeTree.to_rows`` orders its rows. Counts scale with the clients analyzed (``scales_with_n``).

    The levels are the mechanism's own (``prefix_lengths`` of a dyadic tree of any branching) or, for a
    mechanism that stores a subset of the binary tree's nodes ([MultiMsg]'s left children, ``mm_range``), every
    level 1..bits: the demo joins estimates to the truth by node name, so a superset is what it needs.
    """
    bits = spec.domain["bits"]
    leaf_counts = np.bincount(leaves_of(spec, values), minlength=2 ** bits).astype(np.float64)
    names, truth = ["0/0"], [np.array([leaf_counts.sum()])]
    for length in spec.randomizer.prefix_lengths or range(1, bits + 1):
        names.extend(f"{length}/{i}" for i in range(1 << length))
        truth.append(leaf_counts.reshape(1 << length, -1).sum(axis=1))
    counts = np.concatenate(truth)
    return {"item": np.asarray(names, dtype=object), "truth": counts, "population": np.full(counts.size, len(values)),
            "scales_with_n": np.ones(counts.size, dtype=bool)}


def quantile_truth(spec: AnalysisSpec, values: np.ndarray) -> dict[str, np.ndarray]:
    """Tree nodes, then per spec quantile q the upper edge (value units) of the bucket holding the empirical
    q-quantile: the smallest leaf j with #{leaf <= j} >= q n, as ``readout.quantile_items`` reports it."""
    out = tree_truth(spec, values)
    leaves = np.sort(leaves_of(spec, values))
    n = leaves.size
    qs = spec.domain["quantiles"]
    # #{leaf <= j} >= q n first holds at the ceil(q n)-th smallest leaf
    edges = [leaf_value(spec, leaves[max(int(np.ceil(q * n * (1 - 1e-12))), 1) - 1] + 1) for q in qs]
    k = len(qs)
    return {"item": np.concatenate([out["item"], np.asarray([f"quantile:{q:g}" for q in qs], dtype=object)]),
            "truth": np.concatenate([out["truth"], edges]),
            "population": np.concatenate([out["population"], np.full(k, n)]),
            "scales_with_n": np.concatenate([out["scales_with_n"], np.zeros(k, dtype=bool)])}


# -- heavy hitters: URL-like strings, Zipf over a large vocabulary ------------------------------------------

URL_VOCABULARY = 1 << 20
_HOSTS = ("www.example.com", "shop.example.com", "news.example.org", "docs.example.net", "m.example.com")
_SECTIONS = ("home", "search", "article", "product", "video", "profile", "help", "cart", "blog", "tag", "img")


def url_of(rank: int) -> str:
    """The URL of popularity rank ``rank`` (0 = most visited): distinct for every rank."""
    return f"https://{_HOSTS[rank % len(_HOSTS)]}/{_SECTIONS[(rank // 5) % len(_SECTIONS)]}/{rank:x}"


def url_values(spec: AnalysisSpec, n: int, rng: np.random.Generator, law: Any) -> np.ndarray:
    """Visited URLs (str objects): Zipf(zipf_s) by rank over 2^20 possible URLs, or uniform over them."""
    ranks = np.arange(1, URL_VOCABULARY + 1, dtype=np.float64)
    p = ranks ** -(law.zipf_s if law.distribution == "zipf" else 0.0)
    drawn = rng.choice(URL_VOCABULARY, size=n, p=p / p.sum())
    unique, inverse = np.unique(drawn, return_inverse=True)
    names = np.array([url_of(int(r)) for r in unique], dtype=object)
    return names[inverse]


def heavy_hitter_truth(spec: AnalysisSpec, values: np.ndarray) -> dict[str, np.ndarray]:
    """True frequency of every item hash held by a client (item = the hex hash the analyzer reports; strings
    colliding in the hash are one item to it too), most frequent first; ``example`` = one string per hash."""
    bits = spec.domain["bits"]
    digits = (bits + 3) // 4
    strings = np.asarray([str(v) for v in values])
    hashes = item_hash(strings, bits) if strings.size else np.zeros(0, dtype=np.uint64)
    unique, first, counts = np.unique(hashes, return_index=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    names = np.asarray([f"{int(h):0{digits}x}" for h in unique[order].tolist()], dtype=object)
    return {"item": names, "truth": counts[order] / max(len(values), 1), "count": counts[order],
            "example": np.asarray(strings[first[order]], dtype=object)}
