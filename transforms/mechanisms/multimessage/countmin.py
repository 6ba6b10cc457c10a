"""Public-coin count-min sketch + multi-message randomized response ([MultiMsg] §4.2, Alg. 2; docs/mathematics.md §7.2).

Public hash functions ``h_r : [d] -> [s]``, r in [tau] (``hashing.hash_to_buckets`` with a per-row seed
derived from the public ``hash_seed``). A client sends ``(r, h_r(j))`` for every element j of its set and
every row r, and, independently for each of the ``tau s`` cells, the blanket message ``(r, l)`` with
probability gamma. The analyzer's table ``T[r, l]`` (message counts) holds true increments, collisions and
i.i.d. Bin(n, gamma) blanket noise per cell; ``x_hat_j = min_r T[r, h_r(j)] - offset``.

**Estimator.** The paper subtracts ``gamma n`` (``estimator="paper"``). The minimum of tau i.i.d. noises is
biased low, so by default (``"debiased"``) we subtract ``E[min_r N_r]`` instead, computed exactly from
``P[min_r N_r >= m] = P[Bin(n, gamma) >= m]^tau``: unbiased for an item without collisions. Collisions (other
held items in the same cell in every row) only add, so the error is one-sided above that. ``stderr`` is the
collision-free sd; :meth:`CountMinMultiRR.exact_moments` gives the exact mean and variance for known data.

**Blanket sampling with fixed draw shapes.** Geometric skipping from ``cap`` uniforms per client: gaps
``floor(ln(1 - U)/ln(1 - gamma))`` give exactly i.i.d. Bernoulli(gamma) cells in increasing order; the client
sends the cells that fall inside the table. More than ``cap`` selected cells (probability
``P[Bin(tau s, gamma) > cap]``) are cut to the first ``cap``; that event's cost is added to delta
(``privacy.multimessage.truncation_delta``), and ``cap`` is chosen so it costs at most 1% of delta.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomness
from transforms.mechanisms.frequency.counting import empty_mask_if_malformed, structured
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.mechanisms.multimessage.common import (
    MessageAccumulator,
    ShuffleOnlyProtocol,
    ceil_log2,
    check_delta,
    check_positive_int,
    check_sets,
)
from transforms.privacy.binomial import binom_sf
from transforms.privacy.multimessage import (
    TRUNCATION_SHARE,
    blanket_cap,
    countmin_delta,
    countmin_epsilon,
    countmin_grid,
    countmin_min_gamma,
    countmin_paper_buckets,
    countmin_paper_gamma,
    countmin_paper_rows,
)

__all__ = ["CountMinMultiRR", "CountMinMultiRRAccumulator"]

ESTIMATORS = ("debiased", "paper")
MAX_ROWS = 1 << 16
MAX_CELLS = 1 << 40
MAX_ENUMERATED_CELLS = 16
_ROW_SEED_STRIDE = 1 << 20


@dataclass(frozen=True)
class CountMinMultiRR(ShuffleOnlyProtocol):
    """[MultiMsg] §4.2: tau data messages per element plus ~tau s gamma blanket messages; O(tau) query time.

    Defaults: ``rows = ceil(log2(2 d / beta))``, ``buckets = 2 n_expected k_set``, ``gamma`` the least value
    the numeric accountant certifies for ``(epsilon, delta)`` at ``n_expected`` (``calibration="numeric"``) or
    the paper's rule (``"paper"``, refused when > 1, i.e. for all but huge n). ``max_blanket`` overrides the
    per-client cap of blanket messages (the ledger then charges its truncation cost to delta).
    """

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    name: ClassVar[str] = "mm_countmin"
    payload_kind: ClassVar[str] = "hashed"
    single_message: ClassVar[bool] = False
    channels: ClassVar[int] = 1
    d: int
    epsilon: float
    delta: float
    n_expected: int
    k_set: int = 1
    beta: float = 0.01
    rows: int | None = None
    buckets: int | None = None
    gamma: float | None = None
    calibration: str = "numeric"
    hash_seed: int = 0
    estimator: str = "debiased"
    max_blanket: int | None = None

    def __post_init__(self) -> None:
        self._freeze_protocol()
        object.__setattr__(self, "beta", check_delta(self.beta))
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")
        object.__setattr__(self, "hash_seed", check_positive_int("hash_seed", self.hash_seed, 0))
        if self.hash_seed >= 1 << 40:
            raise ValueError(f"hash_seed must be < 2^40, got {self.hash_seed}")
        rows = countmin_paper_rows(self.d, self.beta) if self.rows is None else self.rows
        object.__setattr__(self, "rows", check_positive_int("rows", rows))
        buckets = countmin_paper_buckets(self.n_expected, self.k_set) if self.buckets is None else self.buckets
        object.__setattr__(self, "buckets", check_positive_int("buckets", buckets, 2))
        if self.rows_ > MAX_ROWS or self.cells > MAX_CELLS:
            raise ValueError(f"rows <= {MAX_ROWS} and rows * buckets <= 2^40 required, got {self.rows_} x "
                             f"{self.buckets_}")
        if self.gamma is None:
            if self.calibration == "paper":
                gamma = self.paper_gamma
                if gamma > 1.0:
                    raise ValueError(f"the paper's gamma = {gamma:.3g} > 1 is infeasible for n={self.n_expected} "
                                     "(it needs n in the millions): use calibration='numeric', or raise epsilon")
            else:
                gamma = countmin_min_gamma(self.n_expected, self.rows_, self.buckets_, self.k_set, self.epsilon,
                                           self.delta, self.grid)
        else:
            gamma = self.gamma
        if isinstance(gamma, bool) or not 0.0 < float(gamma) <= 1.0:
            raise ValueError(f"gamma (blanket probability per cell) must lie in (0, 1], got {gamma!r}")
        object.__setattr__(self, "gamma", float(gamma))
        if self.max_blanket is not None:
            object.__setattr__(self, "max_blanket", check_positive_int("max_blanket", self.max_blanket, 0))

    # -- public parameters --------------------------------------------------------------------------------

    @property
    def rows_(self) -> int:
        assert self.rows is not None
        return int(self.rows)

    @property
    def buckets_(self) -> int:
        assert self.buckets is not None
        return int(self.buckets)

    @property
    def gamma_(self) -> float:
        assert self.gamma is not None
        return float(self.gamma)

    @property
    def cells(self) -> int:
        return self.rows_ * self.buckets_

    @property
    def paper_gamma(self) -> float:
        return countmin_paper_gamma(self.n_expected, self.rows_, self.k_set, self.epsilon, self.delta)

    @property
    def grid(self) -> float:
        """Loss grid of the numeric accountant (its rounding costs at most epsilon/200)."""
        return countmin_grid(self.epsilon, self.rows_)

    @cached_property
    def cap(self) -> int:
        """Most blanket messages one client sends (default: truncation costs <= 1% of delta at n_expected)."""
        if self.max_blanket is not None:
            return min(self.max_blanket, self.cells)
        return blanket_cap(self.cells, self.gamma_, self.n_expected, self.epsilon, TRUNCATION_SHARE * self.delta)

    @property
    def messages_per_channel(self) -> int:
        """k_set tau data messages plus at most ``cap`` blanket messages (the shuffler's flood quota)."""
        return self.k_set * self.rows_ + self.cap

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("channel", "<i8"), ("seed", "<u4"), ("z", "<i8")])

    @property
    def message_bits(self) -> int:
        return ceil_log2(self.rows_) + ceil_log2(self.buckets_)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "delta": self.delta, "n_expected": self.n_expected,
                "k_set": self.k_set, "beta": self.beta, "rows": self.rows_, "buckets": self.buckets_,
                "gamma": self.gamma_, "calibration": self.calibration, "hash_seed": self.hash_seed,
                "estimator": self.estimator, "max_blanket": self.cap}

    def hash_rows(self, elements: np.ndarray) -> np.ndarray:
        """``h_r(j)`` for every element (last axis: the tau rows), int64 buckets in [s)."""
        seeds = (np.uint64(self.hash_seed) * np.uint64(_ROW_SEED_STRIDE)) + np.arange(self.rows_, dtype=np.uint64)
        return hash_to_buckets(seeds, np.asarray(elements)[..., None], self.buckets_)

    @cached_property
    def hash_table(self) -> np.ndarray:
        """``H[r, j]`` for every row and item (tau x d), computed once for decoding."""
        return np.ascontiguousarray(self.hash_rows(np.arange(self.d)).T)

    # -- privacy ------------------------------------------------------------------------------------------

    def epsilon_central(self, n: int, delta: float) -> float:
        """Certified central epsilon of n shuffled clients at ``delta`` (numeric accountant + truncation)."""
        if n < 2 or self.gamma_ >= 1.0:
            return float("inf")
        return countmin_epsilon(n, self.gamma_, self.rows_, self.buckets_, self.k_set, self.cap, delta, self.grid)

    def delta_central(self, n: int, epsilon: float) -> float:
        if n < 2:
            return 1.0
        return countmin_delta(n, self.gamma_, self.rows_, self.buckets_, self.k_set, self.cap, epsilon, self.grid)

    def ledger(self, n: int | None = None) -> dict[str, Any]:
        """Cost and privacy of the protocol for n clients (default n_expected): paper rule vs numeric."""
        n = self.n_expected if n is None else check_positive_int("n", n, 2)
        paper_gamma = countmin_paper_gamma(n, self.rows_, self.k_set, self.epsilon, self.delta)
        blanket_expected = self.cells * self.gamma_  # minus a negligible truncated part
        paper_claims = paper_gamma <= self.gamma_  # Lemma 4.10's condition (it ignores our blanket cap)
        return self._ledger(
            "[MultiMsg] §4.2 count-min + multi-message randomized response", n,
            self.k_set * self.rows_ + blanket_expected, self.messages_per_channel, paper_claims,
            paper_rule_gamma=paper_gamma,
            paper_rule_feasible=paper_gamma <= 1.0,
            paper_rule_messages_per_client=self.k_set * self.rows_ + self.cells * min(paper_gamma, 1.0),
            rows=self.rows_,
            buckets=self.buckets_,
            gamma=self.gamma_,
            blanket_cap=self.cap,
        )

    # -- client -------------------------------------------------------------------------------------------

    def encode_sets(self, sets: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """Sets (``(n, k_set)``, -1 = empty slot) -> tau messages per element + blanket, owner-consecutive.

        One draw of shape ``(n, cap)`` uniforms whatever the data. The number of messages is random (blanket)
        and, for sets of different sizes, data-dependent: the shuffler (not the analyzer) learns |S_i|.
        """
        s = check_sets(sets, self.d, self.k_set)
        n, tau = s.shape[0], self.rows_
        data_rows = np.broadcast_to(np.arange(tau), (n, self.k_set, tau)).reshape(n, -1)
        data_buckets = self.hash_rows(np.maximum(s, 0)).reshape(n, -1)
        data_ok = np.repeat(s >= 0, tau, axis=1)
        u = rng.random((n, self.cap))
        # Geometric gaps between selected cells (gamma = 1: every cell, no gaps).
        gaps = np.zeros(u.shape) if self.gamma_ >= 1.0 else np.floor(np.log1p(-u) / math.log1p(-self.gamma_))
        position = np.cumsum(np.minimum(gaps, self.cells) + 1.0, axis=1) - 1.0  # float: no overflow
        blanket_ok = position < self.cells
        cell = np.where(blanket_ok, position, 0).astype(np.int64)
        row = np.concatenate([data_rows, cell // self.buckets_], axis=1)
        bucket = np.concatenate([data_buckets, cell % self.buckets_], axis=1)
        ok = np.concatenate([data_ok, blanket_ok], axis=1)
        owner = np.nonzero(ok)[0].astype(np.int64)
        reports = structured(self.report_dtype, channel=np.zeros(owner.size, np.int64),
                             seed=row[ok].astype(np.uint32), z=bucket[ok])
        return reports, owner

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        row, z = reports["seed"], reports["z"]
        return (reports["channel"] == 0) & (row >= 0) & (row < self.rows_) & (z >= 0) & (z < self.buckets_)

    # -- analyzer -----------------------------------------------------------------------------------------

    def new_accumulator(self) -> CountMinMultiRRAccumulator:
        return CountMinMultiRRAccumulator(self)

    def noise_survival(self, n: int, m: np.ndarray) -> np.ndarray:
        """``P[N >= m]`` for one cell's blanket noise N ~ Bin(n, gamma)."""
        return binom_sf(np.asarray(m) - 1, n, self.gamma_)

    def _min_moments(self, n: int, floors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of ``M = min_r (a_r + N_r)`` for each row of ``floors`` (items x tau), N_r iid.

        ``E[M] = base + sum_{m > base} P[M >= m]`` and ``E[M^2] = base^2 + sum_{m > base} (2m - 1) P[M >= m]``
        with ``base = min_r a_r`` and ``P[M >= m] = prod_r P[N >= m - a_r] <= P[N >= m - base]``, so the sums
        stop 40 sd above the noise mean (the neglected terms are below 1e-300).
        """
        a = np.asarray(floors, dtype=np.int64)
        mean_n = n * self.gamma_
        width = min(n, math.ceil(mean_n + 40.0 * math.sqrt(mean_n + 1.0) + 40.0))
        steps = np.arange(1, width + 1)
        first, second = np.empty(len(a)), np.empty(len(a))
        chunk = max(1, (1 << 22) // (width * self.rows_))
        for start in range(0, len(a), chunk):
            block = a[start : start + chunk]
            base = block.min(axis=1)
            m = base[:, None] + steps[None, :]
            surv = np.prod(self.noise_survival(n, m[:, :, None] - block[:, None, :]), axis=2)  # P[M >= m]
            first[start : start + chunk] = base + surv.sum(axis=1)
            second[start : start + chunk] = base.astype(float) ** 2 + ((2 * m - 1) * surv).sum(axis=1)
        return first, np.maximum(second - first**2, 0.0)

    @cached_property
    def _noise_min_cache(self) -> dict[int, tuple[float, float]]:
        return {}

    def noise_min_moments(self, n: int) -> tuple[float, float]:
        """Mean and variance of ``min_r N_r`` (tau iid Bin(n, gamma)): the collision-free error law."""
        if n not in self._noise_min_cache:
            mean, var = self._min_moments(n, np.zeros((1, self.rows_), np.int64))
            self._noise_min_cache[n] = (float(mean[0]), float(var[0]))
        return self._noise_min_cache[n]

    def offset(self, n: int) -> float:
        """What the estimator subtracts from the row minimum: E[min_r N_r] (debiased) or gamma n (paper)."""
        return self.noise_min_moments(n)[0] if self.estimator == "debiased" else self.gamma_ * n

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Collision-free variance ``Var[min_r N_r]`` (the same for every item)."""
        return np.full(np.shape(counts), self.noise_min_moments(n)[1])

    def exact_moments(self, true_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact mean and variance of every item's estimate for known data (collisions included)."""
        c = np.asarray(true_counts, dtype=np.int64)
        n = int(c.sum())
        H = self.hash_table
        cell_totals = np.stack([np.bincount(H[r], weights=c, minlength=self.buckets_) for r in range(self.rows_)])
        floors = np.take_along_axis(cell_totals, H, axis=1).T.astype(np.int64)  # (d, tau): a_r(j)
        mean, var = self._min_moments(n, floors)
        return mean - self.offset(n), var

    # -- enumeration (tests) ------------------------------------------------------------------------------

    def exact_message_distribution(self, elements: int | list[int]) -> dict[tuple, float]:
        """P(multiset of one client's messages | its set), tiny tables only: keys are sorted (row, bucket)
        tuples. Each cell is a Bernoulli(gamma) blanket message; beyond ``cap`` cells only the first ``cap``
        (in row-major order) are sent."""
        if self.cells > MAX_ENUMERATED_CELLS:
            raise ValueError(f"enumerating 2^{self.cells} blanket subsets exceeds 2^{MAX_ENUMERATED_CELLS}")
        elems = [int(elements)] if np.isscalar(elements) else [int(e) for e in elements]  # type: ignore[union-attr]
        s = check_sets(np.array([elems + [-1] * (self.k_set - len(elems))]), self.d, self.k_set)[0]
        data = [(r, int(self.hash_rows(np.array(j))[r])) for j in s if j >= 0 for r in range(self.rows_)]
        out: dict[tuple, float] = {}
        g = self.gamma_
        for chosen in itertools.product((0, 1), repeat=self.cells):
            k = sum(chosen)
            prob = g**k * (1.0 - g) ** (self.cells - k)
            cells = [c for c in range(self.cells) if chosen[c]][: self.cap]
            key = tuple(sorted(data + [divmod(c, self.buckets_) for c in cells]))
            out[key] = out.get(key, 0.0) + prob
        return out


class CountMinMultiRRAccumulator(MessageAccumulator):
    """The tau x s table of message counts; decoded by ``min_r T[r, h_r(j)] - offset`` for every item."""

    mechanism: CountMinMultiRR

    def __init__(self, mechanism: CountMinMultiRR) -> None:
        super().__init__(mechanism, (mechanism.rows_, mechanism.buckets_))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        m = self.mechanism
        cells = reports["seed"].astype(np.int64) * m.buckets_ + reports["z"]
        return np.bincount(cells, minlength=m.cells).reshape(m.rows_, m.buckets_)

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        m = self.mechanism
        row_min = np.take_along_axis(self.counts, m.hash_table, axis=1).min(axis=0)
        offset = m.offset(self.n)
        bias = m.noise_min_moments(self.n)[0] - offset  # collision-free bias of the estimator
        return row_min - offset, {"offset": offset, "collision_free_bias": bias}
