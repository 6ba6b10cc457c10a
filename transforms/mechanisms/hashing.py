"""The public hash family of local hashing (OLH), shared by clients and analyzer.

``H_s(v) = fmix64(fmix64((s * K1) ^ v) ^ (s * K2)) mod g`` with murmur3's 64-bit finalizer: two rounds
of a full-avalanche bijection, with the seed entering both. It is *public*: the seed travels in the clear
in every report, so privacy never depends on the hash quality (the seed is drawn independently of the
data and the randomizer is epsilon-LDP for every fixed hash function). Hash quality only affects
variance, and the OLH decoder (``transforms.mechanisms.frequency.olh``) corrects the finite family's collision
pattern exactly, so the estimator is unbiased whatever this function's statistical defects.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fmix64", "hash_to_buckets"]

_U64 = np.uint64
_K1 = _U64(0x9E3779B97F4A7C15)  # large odd constants (golden ratio, murmur3 c1)
_K2 = _U64(0x87C37B91114253D5)
_F1 = _U64(0xFF51AFD7ED558CCD)
_F2 = _U64(0xC4CEB9FE1A85EC53)


def fmix64(z: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finalizer: a bijection of uint64 in which every input bit flips every output bit
    with probability ~1/2."""
    z = np.asarray(z, dtype=_U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U64(33))) * _F1
        z = (z ^ (z >> _U64(33))) * _F2
        return z ^ (z >> _U64(33))


def hash_to_buckets(seeds: np.ndarray, values: np.ndarray, g: int) -> np.ndarray:
    """Bucket ``H_seed(value)`` in [0, g) as int64, broadcasting ``seeds`` against ``values``.

    ``hash_to_buckets(seeds[:, None], values[None, :], g)`` is the S x d table the analyzer decodes with;
    ``hash_to_buckets(seeds, values, g)`` with two 1-D arrays hashes one report per element. Seeds and
    values must be non-negative integers (values are category indices).
    """
    if int(g) != g or g < 2:
        raise ValueError(f"number of buckets g must be an integer >= 2, got {g!r}")
    s = np.asarray(seeds)
    v = np.asarray(values)
    for name, arr in (("seeds", s), ("values", v)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    s = s.astype(_U64, copy=False)
    v = v.astype(_U64, copy=False)
    with np.errstate(over="ignore"):
        z = fmix64((s * _K1) ^ v)
        z = fmix64(z ^ (s * _K2))
    return (z % _U64(int(g))).astype(np.int64)
