"""Sparse sampling of randomized unary encodings in O(#ones) per client, with draw shapes fixed per row.

A randomized one-hot vector over a large domain (d = 87,680 in [ESA]'s Horse experiment) has only
``p + (d - 1) q`` ones on average; drawing d uniforms per client would cost O(d). Here the ones of a Bernoulli(q)
sequence are found by **geometric skipping**: the gaps between consecutive ones are i.i.d. Geometric(q), one
uniform each (``floor(ln U / ln(1 - q))``, U in (0, 1]). A client's row always consumes the same number of
uniforms -- a *cap* K fixed by the public parameters -- so a ``KeyedRandom`` reproduces it whatever the batch.

**Caps and how the output law deviates.** A row materialises only the first K ones of its vector (in
ascending index order). Every function here returns exactly "the first K ones of the ideal vector": when the
ideal vector has at most K ones that *is* the ideal vector; otherwise its ones beyond the K-th are dropped.
Truncation is a fixed, data-independent function of the ideal output, i.e. post-processing, so it never
weakens a randomizer's (removal or replacement) LDP; it only biases each count by at most n times the
overflow probability, which ``ones_cap`` keeps below 2^-64 (a cap of d means no truncation is possible at all,
the case of every small domain). Beyond that, the law is exact up to the 2^-53 resolution of float64 uniforms,
like every randomizer of this package.
"""

from __future__ import annotations

import math

import numpy as np

from transforms.mechanisms.base import Randomness
from transforms.privacy.binomial import binom_sf

__all__ = [
    "MAX_ENUMERATED_BITS",
    "OVERFLOW_TAIL",
    "bernoulli_positions",
    "first_keys",
    "first_ones_index",
    "keys_to_padded",
    "merge_keys",
    "ones_cap",
    "padded_to_keys",
    "pattern_law",
    "pushforward",
    "row_ranks",
    "unary_keys",
]

OVERFLOW_TAIL = 2.0**-64  # largest accepted probability that a client's vector has more ones than its cap
MAX_ENUMERATED_BITS = 12  # exact laws enumerate 2^bits outputs


def ones_cap(d: int, q: float, tail: float = OVERFLOW_TAIL) -> int:
    """Smallest K in [1, d] with P(1 + Bin(d - 1, q) > K) < ``tail`` (or d, which can never overflow).

    ``1 + Bin(d - 1, q)`` dominates the number of ones of a unary vector whose d - 1 "other" bits are
    Bernoulli(q) or less likely, whatever its own bit does. O(log d) evaluations of the binomial tail.
    """
    trials = d - 1
    if binom_sf(np.array(float(d - 2)), trials, q)[()] >= tail:  # P(Bin >= d - 1) not small: no useful cap
        return d
    low, high = 1, d - 1  # invariant: P(Bin >= high) < tail
    while low < high:
        mid = (low + high) // 2
        if binom_sf(np.array(float(mid - 1)), trials, q)[()] < tail:  # P(Bin >= mid) = P(Bin > mid - 1)
            high = mid
        else:
            low = mid + 1
    return low


def bernoulli_positions(rng: Randomness, n: int, slots: int, q: float, draws: int) -> np.ndarray:
    """Ascending positions of the first ``draws`` ones of n independent Bernoulli(q) sequences of length
    ``slots``: an (n, draws) int64 array padded with ``slots``. Consumes exactly ``draws`` uniforms per row."""
    x = rng.random((n, draws))  # in place below: these arrays are the encoder's main memory traffic
    np.negative(x, out=x)
    np.log1p(x, out=x)  # ln(1 - u) with 1 - u in (0, 1]: finite
    np.divide(x, math.log1p(-q), out=x)
    np.floor(x, out=x)  # the gaps, Geometric(q) on {0, 1, ...}
    np.minimum(x, slots, out=x)
    x += 1.0
    # Integer-valued floats stay exact below 2^53 (gaps are clipped to slots before summing).
    np.cumsum(x, axis=1, out=x)
    x -= 1.0
    np.minimum(x, slots, out=x)
    return x.astype(np.int64)


def padded_to_keys(rows: np.ndarray, pad: int, stride: int) -> np.ndarray:
    """Keys ``row * stride + entry`` of the non-pad entries of an (n, w) array, row-major. Rows ascending and
    entries < stride make the keys globally ascending: a sparse, batch-wide form of the padded rows."""
    owner, column = np.nonzero(rows < pad)
    return owner.astype(np.int64) * stride + rows[owner, column]


def merge_keys(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted union of two ascending key arrays in O(|a| + |b| log |a|) (no per-row sorting)."""
    pos = np.searchsorted(a, b)
    if a.size:  # drop b's keys already in a (pos = a.size means b is past a's last key: never equal)
        fresh = a[np.minimum(pos, a.size - 1)] != b
        b, pos = b[fresh], pos[fresh]
    out = np.empty(a.size + b.size, dtype=np.int64)
    at_b = pos + np.arange(b.size)
    is_a = np.ones(out.size, dtype=bool)
    is_a[at_b] = False
    out[at_b] = b
    out[is_a] = a
    return out


def row_ranks(rows: np.ndarray) -> np.ndarray:
    """Rank of each entry within its row, for entries grouped by row (0 for a row's first entry)."""
    index = np.arange(rows.size)
    first = np.ones(rows.size, dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    return index - np.maximum.accumulate(np.where(first, index, 0)) if rows.size else index


def first_keys(keys: np.ndarray, stride: int, cap: int) -> np.ndarray:
    """The first ``cap`` keys of every row (the truncation of the module docstring)."""
    return keys[row_ranks(keys // stride) < cap]


def unary_keys(values: np.ndarray, rng: Randomness, d: int, p: float, q: float, cap: int) -> np.ndarray:
    """Keys ``row * d + channel`` of the first ``cap`` ones of binary RR applied to the one-hot encoding of each
    value (bit v set w.p. p, every other bit w.p. q), ascending.

    Draws: one uniform for the value's own bit, then ``min(cap, d - 1)`` gaps over the d - 1 other bits (enough
    to know the vector up to its cap-th one). The other bits' positions r map to channels r + (r >= v).
    """
    n = values.size
    own = rng.random(n) < p
    others = bernoulli_positions(rng, n, d - 1, q, min(cap, d - 1))  # padded with d - 1
    channels = others + (others >= values[:, None])  # the pad d - 1 >= v maps to d
    rows = np.arange(n, dtype=np.int64)
    merged = merge_keys(padded_to_keys(channels, d, d), rows[own] * d + values[own])
    return first_keys(merged, d, cap)


def keys_to_padded(keys: np.ndarray, stride: int, n: int, width: int, pad: int) -> np.ndarray:
    """(n, width) array of each row's entries (ascending, at most ``width``), padded with ``pad``."""
    rows, entries = np.divmod(keys, stride)
    out = np.full((n, width), pad, dtype=np.int64)
    out[rows, row_ranks(rows)] = entries
    return out


# -- exact laws for small domains (tests enumerate these) ---------------------------------------------------


def pattern_law(one_prob: np.ndarray) -> np.ndarray:
    """Law of independent bits over all 2^k patterns; bit j of the pattern index is bit j."""
    probs = np.asarray(one_prob, dtype=np.float64)
    k = probs.size
    if k > MAX_ENUMERATED_BITS:
        raise ValueError(f"enumerating 2^{k} patterns needs at most {MAX_ENUMERATED_BITS} bits")
    bits = (np.arange(2**k)[:, None] >> np.arange(k)[None, :]) & 1
    return np.prod(np.where(bits == 1, probs, 1.0 - probs), axis=1)


def first_ones_index(k: int, cap: int) -> np.ndarray:
    """For each k-bit pattern, the pattern made of its ``cap`` lowest set bits (the truncation above)."""
    patterns = np.arange(2**k, dtype=np.int64)
    out = np.zeros_like(patterns)
    remaining = patterns.copy()
    for _ in range(min(cap, k)):
        lowest = remaining & -remaining
        out |= lowest
        remaining ^= lowest
    return out


def pushforward(law: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Law of ``index[Y]`` for Y with law ``law`` (both over the same pattern space)."""
    return np.bincount(index, weights=law, minlength=law.size)
