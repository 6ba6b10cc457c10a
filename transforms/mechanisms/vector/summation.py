"""[VecSum]'s single-message shuffle-model vector summation (docs/mathematics.md §4.1) and its central guarantee;
LDP-SGD (§4.2) lives in ``ldp_sgd`` and is re-exported here.

**Input**: float64 ``[n, d]`` in **[0, 1]** ([VecSum]'s range; map [-1, 1] data by ``(1 + x)/2`` first).
**Client** ([VecSum] Alg. 2 with Alg. 1): sample t distinct coordinates, randomly round each value to the grid
{0..k_round} (unbiased), then keep the level w.p. 1 - gamma or replace it by a uniform level. gamma is derived
from the *central* target (epsilon, delta) and the public number of clients n ([VecSum] §4.3/§4.5 [P*]), so
``epsilon`` here is the shuffle-model epsilon; the local guarantee is
``epsilon_local = t ln(1 + (k+1)(1-gamma)/gamma)`` [D].
**Message**: payload ``coordinates`` -- ``indices`` int64 (t,) ascending, ``values`` float64 (t,) holding the
integer level (exact in a double). We chose it over ``integers`` because the record is self-describing (index and
level travel as separate named arrays) and is the schema's record for exactly this mechanism.
**Analyzer** (Alg. 3): per coordinate (reports m, sum of levels, sum of squared levels) -- integers, merged by
addition. ``DeBias`` turns each level into ``w = (y/k - gamma/2)/(1 - gamma)`` with ``E[w] = x``; the published
mean is the ratio ``sum w / m`` (the authors' code; exactly unbiased given m >= 1 because the reporting subset
is a uniform m-subset), the Horvitz-Thompson mean ``(d/(t n)) sum w`` is in ``extras``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy.stats import binom

from transforms.mechanisms.base import Randomizer, Randomness, VectorEstimate, check_epsilon
from transforms.mechanisms.frequency.counting import CountAccumulator, empty_mask_if_malformed, structured
from transforms.mechanisms.vector.ldp_sgd import LdpSgdAccumulator, LdpSgdRandomizer
from transforms.privacy.mixture import alpha_generic, alpha_grr

__all__ = [
    "MAX_EPSILON_002",
    "LdpSgdAccumulator",
    "LdpSgdRandomizer",
    "VectorSumAccumulator",
    "VectorSummation",
    "epsilon_002",
    "gamma_002",
    "k_round_002",
]

MAX_EPSILON_002 = 6.0  # [VecSum]'s analysis covers epsilon < 6


def _check_002(d: int, n: int, delta: float, t: int) -> None:
    if int(d) != d or d < 1:
        raise ValueError(f"dimension d must be an integer >= 1, got {d!r}")
    if isinstance(n, bool) or int(n) != n or n < 2:
        raise ValueError(f"n (public number of clients) must be an integer >= 2, got {n!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if isinstance(t, bool) or int(t) != t or not 1 <= t <= d:
        raise ValueError(f"t (coordinates per client) must be an integer in [1, d] = [1, {d}], got {t!r}")


def _constants(d: int, k: float, n: int, delta: float, t: int, low: bool) -> tuple[float, float]:
    """(A, B) with ``gamma = max(A/eps^2, B/eps)`` in the branch eps < 1 (``low``) or 1 <= eps < 6 [P*]."""
    dk = d * k / (n - 1)
    if t == 1:  # §4.5, no composition
        return (14.0 if low else 80.0) * dk * math.log(2 / delta), (27.0 if low else 36.0) * dk
    # Thm 4.1, advanced composition over the t coordinates (no 1/eps term)
    return (56.0 if low else 2016.0) * dk * math.log(1 / delta) * math.log(2 * t / delta), 0.0


def gamma_002(d: int, k_round: int, n: int, epsilon: float, delta: float, t: int = 1) -> float:
    """[VecSum]'s blanket probability gamma for central (epsilon, delta)-DP with n clients
    (docs/mathematics.md §4.1) [P*]."""
    _check_002(d, n, delta, t)
    check_epsilon(epsilon)
    if epsilon >= MAX_EPSILON_002:
        raise ValueError(f"[VecSum]'s analysis covers epsilon < {MAX_EPSILON_002}, got {epsilon!r}")
    a, b = _constants(d, k_round, n, delta, t, epsilon < 1)
    return max(a / epsilon**2, b / epsilon)


def k_round_002(d: int, n: int, epsilon: float, delta: float, t: int = 1) -> float:
    """[VecSum]'s MSE-optimal (continuous) precision k* (docs/mathematics.md §4.1 "Choosing k_round") [P*]."""
    _check_002(d, n, delta, t)
    check_epsilon(epsilon)
    low = epsilon < 1
    if t == 1:
        c_a, c_b = (28.0, 54.0) if low else (160.0, 72.0)
        return min((n * epsilon**2 / (c_a * d * math.log(2 / delta))) ** (1 / 3), (n * epsilon / (c_b * d)) ** (1 / 3))
    big_a = 28.0 if low else 1008.0
    denom = 4 * big_a * d * math.log(1 / delta) * math.log(2 * t / delta)
    return ((n - 1) * epsilon**2 / denom) ** (1 / 3)


def epsilon_002(d: int, k_round: int, n: int, gamma: float, delta: float, t: int = 1) -> float:
    """[VecSum]'s central guarantee: the smallest epsilon (< 6) for which ``gamma`` satisfies §4.1's formula, i.e. the
    shuffled protocol with n clients is (epsilon, delta)-DP. Raises if gamma certifies no epsilon < 6."""
    _check_002(d, n, delta, t)
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma!r}")
    for low in (True, False):
        a, b = _constants(d, k_round, n, delta, t, low)
        eps = max(math.sqrt(a / gamma), b / gamma, 0.0 if low else 1.0)
        if eps < (1.0 if low else MAX_EPSILON_002):
            return eps
    raise ValueError(f"gamma={gamma!r} certifies no epsilon < {MAX_EPSILON_002} for d={d}, k={k_round}, n={n}, t={t}")


@dataclass(frozen=True)
class VectorSummation(Randomizer):
    """[VecSum] vector summation: t sampled coordinates, randomized rounding to k_round levels, (k+1)-ary RR.

    ``epsilon``/``delta`` are the *central* target for at least ``n`` shuffled clients; ``k_round`` defaults to
    [VecSum]'s rule rounded to an integer >= 1. Construction refuses parameters for which gamma >= 1.
    """

    calibrated_to_central: ClassVar[bool] = True  # epsilon is the central target its noise is sized to

    name: ClassVar[str] = "vector_sum"
    payload_kind: ClassVar[str] = "coordinates"
    # [VecSum] sums values on [0, 1]: callers map their value range onto it and the estimate back
    input_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    d: int
    epsilon: float
    delta: float = 1e-6
    n: int = 10_000
    t: int = 1
    k_round: int | None = None
    gamma: float = field(init=False)

    def __post_init__(self) -> None:
        _check_002(self.d, self.n, self.delta, self.t)
        check_epsilon(self.epsilon)
        object.__setattr__(self, "d", int(self.d))
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "t", int(self.t))
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "delta", float(self.delta))
        k = self.k_round
        if k is None:
            k = max(1, round(k_round_002(self.d, self.n, self.epsilon, self.delta, self.t)))
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k_round must be an integer >= 1, got {k!r}")
        object.__setattr__(self, "k_round", int(k))
        g = gamma_002(self.d, int(k), self.n, self.epsilon, self.delta, self.t)
        if g >= 1:
            n_min = math.floor((self.n - 1) * g) + 2
            raise ValueError(
                f"infeasible [VecSum] parameters: gamma = {g:.4g} >= 1 (d={self.d}, k_round={k}, t={self.t}, "
                f"epsilon={self.epsilon}, delta={self.delta}, n={self.n}); raise n to at least {n_min}, raise "
                f"epsilon, or lower t / k_round (gamma grows linearly with k_round)"
            )
        object.__setattr__(self, "gamma", float(g))

    @property
    def levels(self) -> int:
        """k_round + 1 output levels."""
        assert self.k_round is not None
        return self.k_round + 1

    @property
    def epsilon0(self) -> float:
        """LDP of one reported coordinate: (k+1)-ary RR with blanket gamma, ``ln(1 + (k+1)(1-gamma)/gamma)`` [D]."""
        return math.log1p(self.levels * (1 - self.gamma) / self.gamma)

    @property
    def epsilon_local(self) -> float:
        return self.t * self.epsilon0  # t coordinates compose; tight when d >= t (extreme inputs)

    @property
    def mixture_alpha(self) -> float:
        """t = 1: the GRR value gamma/(k+1) (coordinate sampling only averages TV); t > 1: generic 1/(e^eps+1)."""
        if self.t == 1:
            return alpha_grr(self.epsilon0, self.levels)
        return alpha_generic(self.epsilon_local)

    def central_guarantee(self) -> tuple[float, float]:
        """(epsilon, delta) certified by [VecSum] for >= n shuffled clients (equals the target up to rounding)."""
        assert self.k_round is not None
        return epsilon_002(self.d, self.k_round, self.n, self.gamma, self.delta, self.t), self.delta

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("indices", "<i8", (self.t,)), ("values", "<f8", (self.t,))])

    @property
    def message_bits(self) -> int:
        assert self.k_round is not None
        return self.t * ((self.d - 1).bit_length() + self.k_round.bit_length())

    def sample_coordinates(self, n: int, rng: Randomness) -> np.ndarray:
        """t distinct uniform coordinates per client, ascending: draw the j-th as a rank among the d - j unchosen
        ones and map the rank past the chosen ones (O(n t^2), data-independent draw shapes)."""
        chosen = np.empty((n, 0), dtype=np.int64)
        for j in range(self.t):
            r = rng.integers(0, self.d - j, n)
            for c in range(j):
                r = r + (r >= chosen[:, c])
            chosen = np.sort(np.column_stack([chosen, r]), axis=1)
        return chosen

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"values must have shape [n, d] = [n, {self.d}], got {x.shape}")
        if x.size and not (np.all(np.isfinite(x)) and x.min() >= 0.0 and x.max() <= 1.0):
            raise ValueError("values must be finite and lie in [0, 1] (map [-1, 1] data by (1 + x)/2)")
        n = x.shape[0]
        idx = self.sample_coordinates(n, rng)
        scaled = np.take_along_axis(x, idx, axis=1) * self.k_round
        low = np.floor(scaled)
        level = low + (rng.random((n, self.t)) < scaled - low)
        blanket = rng.random((n, self.t)) < self.gamma
        level = np.where(blanket, rng.integers(0, self.levels, (n, self.t)), level)
        return structured(self.report_dtype, indices=idx, values=level.astype(np.float64))

    def validate(self, reports: np.ndarray) -> np.ndarray:
        """Indices in [d] strictly ascending; values integer levels in {0..k}."""
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        idx, val = reports["indices"], reports["values"]
        ok = np.all((idx >= 0) & (idx < self.d), axis=1) & np.all(np.diff(idx, axis=1) > 0, axis=1)
        with np.errstate(invalid="ignore"):
            return ok & np.all((val >= 0) & (val <= self.k_round) & (np.floor(val) == val), axis=1)

    def new_accumulator(self) -> VectorSumAccumulator:
        return VectorSumAccumulator(self)

    def debias(self, count: np.ndarray, level_sum: np.ndarray, level_sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sum w, sum w^2) over the reports of each coordinate, ``w = (y/k - gamma/2)/(1 - gamma)`` (Alg. 3)."""
        k, g = float(self.k_round), self.gamma  # type: ignore[arg-type]
        s1 = (level_sum / k - g * count / 2) / (1 - g)
        s2 = (level_sq / k**2 - g * level_sum / k + g**2 * count / 4) / (1 - g) ** 2
        return s1, s2

    def report_variance(self, x: np.ndarray) -> np.ndarray:
        """Exact ``Var[w | x]`` of one report of value x (docs/mathematics.md §4.1 V(x)) [D✓]."""
        k, g = float(self.k_round), self.gamma  # type: ignore[arg-type]
        xa = np.asarray(x, dtype=np.float64)
        f = xa * k - np.floor(xa * k)
        num = (1 - g) * f * (1 - f) + g * (1 - g) * k**2 * (xa**2 - xa) + g * k * (2 * k + 1) / 6 - g**2 * k**2 / 4
        return num / (k**2 * (1 - g) ** 2)

    def variance(self, values: np.ndarray) -> np.ndarray:
        """Exact variance ``[d]`` of the published (ratio) mean for this data set, averaging the conditional
        variance ``mean V / m + sigma^2 (n - m)/(m (n - 1))`` over ``m ~ Bin(n, t/d)``, m >= 1."""
        x = np.asarray(values, dtype=np.float64)
        n = x.shape[0]
        m = np.arange(1, n + 1)
        pmf = binom.pmf(m, n, self.t / self.d)
        keep = pmf > 1e-300
        m, pmf = m[keep], pmf[keep] / pmf[keep].sum()
        inv_m, fpc = float(pmf @ (1.0 / m)), float(pmf @ ((n - m) / (m * max(n - 1, 1))))
        return self.report_variance(x).mean(axis=0) * inv_m + x.var(axis=0) * fpc

    def ht_variance(self, values: np.ndarray) -> np.ndarray:
        """Exact variance ``[d]`` of the Horvitz-Thompson mean: ``(1/n^2) sum_i [(d/t)(V + x^2) - x^2]``."""
        x = np.asarray(values, dtype=np.float64)
        per = (self.d / self.t) * (self.report_variance(x) + x**2) - x**2
        return per.sum(axis=0) / x.shape[0] ** 2

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "delta": self.delta, "n": self.n, "t": self.t,
                "k_round": self.k_round, "gamma": self.gamma}

    def exact_level_distribution(self, x: float) -> np.ndarray:
        """P(level = y | value x) for y in {0..k}, one reported coordinate."""
        out = np.full(self.levels, self.gamma / self.levels)
        scaled = x * self.k_round  # type: ignore[operator]
        low = math.floor(scaled)
        out[low] += (1 - self.gamma) * (1 - (scaled - low))
        if low < self.k_round:  # type: ignore[operator]
            out[low + 1] += (1 - self.gamma) * (scaled - low)
        return out


class VectorSumAccumulator(CountAccumulator):
    """Per-coordinate integer counts ``[3, d]``: reports m, sum of levels, sum of squared levels."""

    mechanism: VectorSummation

    def __init__(self, mechanism: VectorSummation) -> None:
        super().__init__(mechanism, (3, mechanism.d))  # type: ignore[arg-type]

    def _count(self, reports: np.ndarray) -> np.ndarray:
        idx, y = reports["indices"].ravel(), reports["values"].ravel()
        d = self.mechanism.d
        stats = [np.bincount(idx, minlength=d), np.bincount(idx, y, minlength=d), np.bincount(idx, y * y, minlength=d)]
        return np.rint(np.stack(stats)).astype(np.int64)  # integer levels: float sums are exact below 2^53

    def estimate(self) -> VectorEstimate:  # type: ignore[override]
        """Ratio mean per coordinate with the plug-in standard error ``sqrt(s_w^2 / m)``.

        ``E[s_w^2] = mean V(x) + S_x^2`` over the reporting subset, so ``s_w^2/m`` estimates the exact variance of
        ``variance()`` up to the finite-population factor n/(n - m) on its sampling part (slightly conservative).
        Coordinates nobody reported get NaN (mean) and inf (stderr).
        """
        if self.n == 0:
            raise ValueError("no reports")
        mech = self.mechanism
        count = self.counts[0].astype(np.float64)
        s1, s2 = mech.debias(count, self.counts[1].astype(np.float64), self.counts[2].astype(np.float64))
        m = np.maximum(count, 1.0)
        mean = np.where(count > 0, s1 / m, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            var_w = np.maximum(s2 - s1**2 / m, 0.0) / (count - 1)
        stderr = np.where(count > 1, np.sqrt(var_w / m), np.inf)
        ht = (mech.d / (mech.t * self.n)) * s1
        extras = {"reports": self.counts[0].copy(), "debiased_sum": s1, "horvitz_thompson": ht,
                  "horvitz_thompson_sum": ht * self.n, "sum": np.where(count > 0, mean * self.n, np.nan),
                  "gamma": mech.gamma, "guarantee_holds": self.n >= mech.n}
        return VectorEstimate(mean=mean, stderr=stderr, n=self.n, extras=extras)
