"""Shared machinery of the count-based frequency oracles (GRR, OUE, OLH).

Their analyzers all keep one integer count array plus ``n``, merge by addition (so any combine tree of
Beam gives the same result) and turn counts into an estimate whose standard error is the closed-form
variance of docs/mathematics.md §2 evaluated at the plug-in counts.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from transforms.mechanisms.base import FrequencyEstimate, Randomizer, check_domain, check_epsilon
from transforms.privacy.mixture import alpha_olh

__all__ = [
    "CountAccumulator",
    "empty_mask_if_malformed",
    "exp_epsilon",
    "rr_count_variance",
    "structured",
]


class _CountedMechanism(Protocol):
    name: str

    def validate(self, reports: np.ndarray) -> np.ndarray: ...

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray: ...


MAX_EPSILON = 700.0  # e^eps overflows float64 just above 709


def exp_epsilon(epsilon: float) -> float:
    """``e^epsilon``, refusing budgets so large that the randomizer probabilities would overflow."""
    if epsilon > MAX_EPSILON:
        raise ValueError(f"epsilon must be <= {MAX_EPSILON} (e^epsilon overflows), got {epsilon!r}")
    return math.exp(epsilon)


def grr_probabilities(epsilon: float, k: int) -> tuple[float, float]:
    """k-ary randomized response: (p, q) = (keep the true value, report one given other value)."""
    e = exp_epsilon(epsilon)
    return e / (e + k - 1), 1.0 / (e + k - 1)


def refuse_invalid(valid: np.ndarray, what: str) -> None:
    """Refuse (rather than miscount) a batch with invalid rows; ``what`` says what they are, e.g. "reports are
    outside the grr output domain"."""
    if not valid.all():
        raise ValueError(f"{int((~valid).sum())} of {valid.size} {what}; filter them with validate() first")


def check_mergeable(acc: Any, other: Any) -> None:
    """Accumulators merge only with one of the same type over the *same* mechanism parameters."""
    if type(other) is not type(acc) or other.mechanism != acc.mechanism:
        raise ValueError(f"cannot merge {other!r} into an accumulator of {acc.mechanism!r}")


class HashedGRR(Randomizer):
    """Mixin for mechanisms that hash a value to one of ``g`` buckets with a public seed, then apply GRR over the
    buckets (OLH, LLH, prefix heavy hitters): the bucket-level probabilities and mixture alpha. GRR runs at
    ``bucket_epsilon`` (``epsilon`` unless a mechanism splits its budget over several messages)."""

    @property
    def bucket_epsilon(self) -> float:
        return self.epsilon  # type: ignore[attr-defined, no-any-return]

    @property
    def buckets(self) -> int:
        """``g`` as an int (it is never None after construction)."""
        g = self.g  # type: ignore[attr-defined]
        assert g is not None
        return int(g)

    @property
    def p(self) -> float:
        """Probability of reporting the hashed bucket itself (GRR over the g buckets)."""
        return grr_probabilities(self.bucket_epsilon, self.buckets)[0]

    @property
    def q_other(self) -> float:
        """Probability of reporting any one given other bucket, ``(1 - p)/(g - 1)``."""
        return grr_probabilities(self.bucket_epsilon, self.buckets)[1]

    @property
    def mixture_alpha(self) -> float:
        """Of one report at ``bucket_epsilon`` (GRR over g buckets for every seed)."""
        return alpha_olh(self.bucket_epsilon, self.buckets)


def seed_family_law(hashes: np.ndarray, buckets: int, p: float, q_other: float) -> np.ndarray:
    """Law of ``(seed, z)`` over a uniform seed family (index ``seed * g + z``), given each seed's hash of the
    value: GRR puts ``p`` on the hashed bucket and ``q_other`` elsewhere."""
    seeds = len(hashes)
    out = np.full((seeds, buckets), q_other)
    out[np.arange(seeds), hashes] = p
    return out.ravel() / seeds


def freeze_domain_and_epsilon(mechanism: Any) -> None:
    """Validate and normalise the ``d`` and ``epsilon`` fields of a frozen mechanism in ``__post_init__``.

    Coercing to ``int``/``float`` keeps the spec hash and the pickled form independent of how the
    numbers were written (``2`` vs ``2.0``).
    """
    check_domain(mechanism.d)
    check_epsilon(mechanism.epsilon)
    exp_epsilon(mechanism.epsilon)
    object.__setattr__(mechanism, "d", int(mechanism.d))
    object.__setattr__(mechanism, "epsilon", float(mechanism.epsilon))


def rr_count_variance(counts: np.ndarray, n: int, p: float, q: float) -> np.ndarray:
    """Variance of the count estimator ``(C - n q)/(p - q)`` where a holder of the item is counted w.p.
    ``p`` and anyone else w.p. ``q``, independently across users (docs/mathematics.md §2.1, §2.2, §2.3)."""
    c = np.asarray(counts, dtype=np.float64)
    return (c * p * (1.0 - p) + (n - c) * q * (1.0 - q)) / (p - q) ** 2


def structured(dtype: np.dtype, **fields: np.ndarray) -> np.ndarray:
    """A structured report array with the given fields filled in."""
    n = len(next(iter(fields.values())))
    out = np.empty(n, dtype=dtype)
    for name, values in fields.items():
        out[name] = values
    return out


def empty_mask_if_malformed(reports: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """All-False mask if ``reports`` lacks a field of ``dtype`` or has a field of the wrong shape.

    A report that is not even of the mechanism's record shape is outside its output domain; the shuffler
    dead-letters it rather than guessing. Returns None when the structure is right.
    """
    arr = np.asarray(reports)
    names = arr.dtype.names or ()
    for name in dtype.names or ():
        if name not in names or arr.dtype[name].shape != dtype[name].shape:
            return np.zeros(arr.shape[:1], dtype=bool)
    if arr.ndim != 1:
        raise ValueError(f"reports must be a 1-D structured array, got shape {arr.shape}")
    return None


class CountAccumulator:
    """Sufficient statistics of one mechanism: an int64 count array and the number of reports.

    Subclasses say how a batch of reports becomes counts (``_count``) and how counts become estimates
    (``_decode``). Memory is O(state), never O(n).
    """

    def __init__(self, mechanism: _CountedMechanism, shape: tuple[int, ...]) -> None:
        self.mechanism = mechanism
        self.counts = np.zeros(shape, dtype=np.int64)
        self.n = 0

    def _count(self, reports: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        raise NotImplementedError

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold validated reports into the counts; refuse (rather than miscount) invalid ones.

        ``clients`` is ignored: one report is one client's (single-message mechanisms)."""
        arr = np.asarray(reports)
        if arr.size == 0:
            return
        refuse_invalid(self.mechanism.validate(arr), f"reports are outside the {self.mechanism.name} output domain")
        self.counts += self._count(arr)
        self.n += int(arr.size)

    def merge(self, other: Any) -> None:
        """Add another accumulator of the *same* mechanism parameters into this one."""
        check_mergeable(self, other)
        self.counts += other.counts
        self.n += other.n

    _empty: str = "no reports"  # what ``estimate`` says when nothing was added

    def _extras(self) -> dict[str, Any]:
        """Extras every estimate of this accumulator carries (before the decoder's own)."""
        return {}

    def estimate(self) -> FrequencyEstimate:
        """Unbiased counts, frequencies and plug-in standard errors (fractions of n)."""
        if self.n == 0:
            raise ValueError(self._empty)
        count, extras = self._decode()
        plug_in = np.clip(count, 0.0, float(self.n))
        stderr = np.sqrt(self.mechanism.variance(plug_in, self.n)) / self.n
        extras = {**self._extras(), **extras}
        return FrequencyEstimate(count=count, frequency=count / self.n, stderr=stderr, n=self.n, extras=extras)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.mechanism!r}, n={self.n})"
