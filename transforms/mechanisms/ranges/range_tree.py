"""The estimate of a dyadic range mechanism: a consistent tree of counts, range answers, quantiles, rows.

**Raw nodes.** Level j (prefix length ``l_j`` bits, ``l_L = bits``) holds the unbiased count of every
prefix, scaled to the population: ``x_j = (n / n_j) c_j`` where ``n_j`` clients reported that level.
Its error has two independent parts: the oracle's (exact RR form ``Var(c_v) = a_j + b_j c_v`` on the
level's scale; GRR adds ``Cov(c_v, c_w) = -(n_j beta^2 + beta(c_v + c_w))``) and, when each client reports
ONE random level ("sample"), the sampling of the n_j clients out of n: conditionally on the level sizes the
clients are a uniformly random partition, so for any per-level weights ``phi_j`` on the leaves

    Var_sampling(sum_j phi_j . x_j) = n^2/(n - 1) [ sum_j (n/n_j) Var_f(phi_j) - Var_f(sum_j phi_j) ]

(multivariate hypergeometric covariances; ``Var_f`` under the leaf distribution f).

**Consistency** (Hay et al. 2010, docs/mathematics.md §5, generalised to per-level variances and fanouts):
bottom-up weighted averaging ``z_j = alpha_j x_j + (1 - alpha_j) A z_{j+1}`` with inverse-variance weights,
then mean consistency top-down from the exactly known root n: ``u_j = z_j + E(u_{j-1} - A z_j)/f_j``. The
weights use data-independent variances (the node variance under uniform data), so the map raw -> u is a
fixed linear projection onto consistent trees: unbiased, and the variance of any answer ``w . u_L`` is
exact through its adjoint ``w -> (a_j)``, evaluated with plug-in counts (consistent, clipped leaves).

**Queries.** ``answer(lo, hi)`` sums the consistent leaves of [lo, hi) (= the sum over its dyadic cover,
``ranges.dyadic_cover``); its stderr comes from the adjoint, which for an interval is piecewise constant
(O(levels^2 * fanout) work, ~1 ms at 16 bits). ``quantile(q)`` searches an isotonic fit of the CDF (§5)
and inverts the band ``CDF -/+ z stderr`` for an interval.

**Rows.** ``to_rows()``/``from_rows()`` carry the raw nodes with the per-level variance model, so a tree
stored as Parquet answers ranges and quantiles with the same numbers as the live accumulator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import isotonic_regression

__all__ = ["ROW_DTYPE", "QuantileEstimate", "RangeTree"]

ROW_DTYPE = np.dtype([
    ("level", "<i8"),  # prefix length in bits (0 = root)
    ("index", "<i8"),  # prefix value in [0, 2^level)
    ("estimate", "<f8"),  # raw unbiased count of the prefix, population scale (root: n, exact)
    ("stderr", "<f8"),  # its standard error (oracle + level sampling, plug-in at the raw estimate)
    ("clients", "<i8"),  # clients that reported this level (root: n)
    ("var_intercept", "<f8"),  # oracle variance model on the level's scale: a + b c, Cov -(n_j beta^2 + ...)
    ("var_slope", "<f8"),
    ("cov_beta", "<f8"),
])


def _agg(x: np.ndarray, fanout: int) -> np.ndarray:
    """Sum groups of ``fanout`` children along the last axis (children -> parents)."""
    return x.reshape(*x.shape[:-1], -1, fanout).sum(axis=-1)


def _spread(x: np.ndarray, fanout: int) -> np.ndarray:
    """Broadcast parents to their ``fanout`` children along the last axis."""
    return np.repeat(x, fanout, axis=-1)


@dataclass(frozen=True)
class QuantileEstimate:
    """q-quantile at leaf resolution: ``leaf`` is the smallest leaf j whose estimated (monotone) CDF
    P(j+1) = #{x <= j} reaches q n (docs/mathematics.md §5; report the bucket's upper edge ``leaf + 1``).

    Error: ``rank_stderr`` is the standard error of the estimated rank at the answer; ``[lower, upper]`` is
    the leaf interval obtained by inverting the band ``P(j+1) -/+ z stderr`` (a ~z-sigma confidence interval
    for the true quantile leaf when the band is monotone).
    """

    q: float
    leaf: int
    rank: float
    rank_stderr: float
    lower: int
    upper: int
    z: float

    @property
    def edge(self) -> int:
        return self.leaf + 1


@dataclass(frozen=True, eq=False)
class RangeTree:
    """Raw level estimates of a dyadic tree over [0, 2^bits) and everything needed to post-process them."""

    structure: ClassVar[str] = "dyadic"  # row layout tag (vs "left_children" of left_children_tree)
    prefix_lengths: tuple[int, ...]
    n: int
    clients: tuple[int, ...]
    raw: tuple[np.ndarray, ...]
    var_intercept: tuple[float, ...]
    var_slope: tuple[float, ...]
    cov_beta: tuple[float, ...]

    def __post_init__(self) -> None:
        lengths = tuple(int(x) for x in self.prefix_lengths)
        if not lengths or lengths[0] < 1 or any(b <= a for a, b in pairwise(lengths)):
            raise ValueError(f"prefix lengths must be increasing and >= 1, got {self.prefix_lengths!r}")
        object.__setattr__(self, "prefix_lengths", lengths)
        L = len(lengths)
        for name in ("clients", "raw", "var_intercept", "var_slope", "cov_beta"):
            if len(getattr(self, name)) != L:
                raise ValueError(f"{name} needs one entry per level ({L})")
        for length, x in zip(lengths, self.raw, strict=True):
            if np.shape(x) != (1 << length,):
                raise ValueError(f"level {length} needs 2^{length} raw estimates, got shape {np.shape(x)}")
        if int(self.n) < 2 or min(self.clients) < 1:
            raise ValueError(f"need n >= 2 clients and >= 1 per level, got n={self.n}, clients={self.clients}")
        object.__setattr__(self, "raw", tuple(np.asarray(x, dtype=np.float64) for x in self.raw))

    # -- structure ----------------------------------------------------------------------------------

    @property
    def bits(self) -> int:
        return self.prefix_lengths[-1]

    @property
    def levels(self) -> int:
        return len(self.prefix_lengths)

    @property
    def sampled(self) -> bool:
        """True when each client reported one level (the level sizes add up to n), which adds sampling error."""
        return self.levels > 1 and sum(self.clients) == self.n

    @cached_property
    def _fanout(self) -> list[int]:
        previous = (0, *self.prefix_lengths[:-1])
        return [1 << (b - a) for a, b in zip(previous, self.prefix_lengths, strict=True)]

    @cached_property
    def _scale(self) -> np.ndarray:
        return self.n / np.asarray(self.clients, dtype=np.float64)

    def _sampling_factor(self) -> float:
        return self.n**2 / (self.n - 1) if self.sampled else 0.0

    # -- consistency --------------------------------------------------------------------------------

    @cached_property
    def _weights(self) -> np.ndarray:
        """alpha_j of the bottom-up pass, from each level's node variance under uniform data (data-independent)."""
        f0 = 2.0 ** -np.asarray(self.prefix_lengths, dtype=np.float64)
        s = self._scale
        counts = np.asarray(self.clients) * f0
        v = s**2 * (np.asarray(self.var_intercept) + np.asarray(self.var_slope) * counts)
        v = v + self._sampling_factor() * (s - 1.0) * f0 * (1.0 - f0)
        alpha = np.ones(self.levels)
        V = v[-1]
        for j in range(self.levels - 2, -1, -1):
            tau = self._fanout[j + 1] * V
            alpha[j] = tau / (v[j] + tau)
            V = v[j] * tau / (v[j] + tau)
        return alpha

    @cached_property
    def consistent(self) -> tuple[np.ndarray, ...]:
        """Consistent counts per level: every node equals the sum of its children, the root equals n."""
        alpha, fan = self._weights, self._fanout
        z: list[np.ndarray] = [self.raw[-1]] * self.levels
        for j in range(self.levels - 2, -1, -1):
            z[j] = alpha[j] * self.raw[j] + (1 - alpha[j]) * _agg(z[j + 1], fan[j + 1])
        out, parent = [], np.array([float(self.n)])
        for j in range(self.levels):
            u = z[j] + _spread(parent - _agg(z[j], fan[j]), fan[j]) / fan[j]
            out.append(u)
            parent = u
        return tuple(out)

    @cached_property
    def _cumulative(self) -> np.ndarray:
        """P(c) for c = 0..2^bits: estimated clients with leaf < c."""
        return np.concatenate(([0.0], np.cumsum(self.consistent[-1])))

    @cached_property
    def _plug_in(self) -> list[np.ndarray]:
        """Leaf distribution for the variance plug-in, per level: the increments of the isotonic CDF fit.

        Clipping the consistent leaves at 0 was the first choice, but on a deep tree (2^16 leaves) the leaves are
        mostly noise, and the clipped mass piles up where there is none: at the true median of a 100k-client
        demo the plug-in CDF was 0.04 instead of 0.35 and the stated stderr 1.2-1.6x too small. The increments
        of the monotone CDF are non-negative, sum to n and follow the data's shape.
        """
        leaves = np.diff(np.concatenate(([0.0], self.monotone_cdf)))
        total = leaves.sum()
        f = leaves / total if total > 0 else np.full(leaves.size, 1.0 / leaves.size)
        out = [f]
        for j in range(self.levels - 1, 0, -1):
            out.append(_agg(out[-1], self._fanout[j]))
        return out[::-1]

    def _adjoint(self, w: np.ndarray) -> list[np.ndarray]:
        """Coefficients a_j on the raw levels of the answer ``w . u_L`` (w: leaf weights, leading dims allowed)."""
        alpha, fan, L = self._weights, self._fanout, self.levels
        ub: list[np.ndarray] = [w] * L
        for j in range(L - 1, 0, -1):
            ub[j - 1] = _agg(ub[j], fan[j]) / fan[j]
        ztd = [ub[j] - _spread(_agg(ub[j], fan[j]), fan[j]) / fan[j] for j in range(L)]
        zb = [ztd[0]]
        for j in range(1, L):
            zb.append(ztd[j] + (1 - alpha[j - 1]) * _spread(zb[j - 1], fan[j]))
        return [alpha[j] * zb[j] for j in range(L)]

    def variance_of(self, w: np.ndarray) -> np.ndarray:
        """Exact variance (at the plug-in) of ``w . u_L`` for leaf weights w of shape (..., 2^bits)."""
        a = self._adjoint(np.asarray(w, dtype=np.float64))
        f = self._plug_in
        total = np.zeros(a[0].shape[:-1])
        sampling = self._sampling_factor()
        phi = np.zeros_like(a[-1]) if sampling else None
        for j in range(self.levels):
            A, s, nj = a[j], self._scale[j], self.clients[j]
            c = f[j] * nj
            sa, sa2, sac, sa2c = A.sum(-1), (A * A).sum(-1), (A @ c), ((A * A) @ c)
            ldp = self.var_intercept[j] * sa2 + self.var_slope[j] * sa2c
            beta = self.cov_beta[j]
            if beta:
                ldp = ldp - nj * beta**2 * (sa**2 - sa2) - 2 * beta * (sa * sac - sa2c)
            total = total + s**2 * ldp
            if phi is not None:
                mean = A @ f[j]
                total = total + sampling * s * ((A * A) @ f[j] - mean**2)
                phi = phi + _spread(A, 1 << (self.bits - self.prefix_lengths[j]))
        if phi is not None:
            mean = phi @ f[-1]
            total = total - sampling * ((phi * phi) @ f[-1] - mean**2)
        return np.maximum(total, 0.0)

    @cached_property
    def _plug_in_cumulative(self) -> list[np.ndarray]:
        """Per level, cumulative plug-in mass over node indices (leading 0): interval sums in O(1)."""
        return [np.concatenate(([0.0], np.cumsum(f))) for f in self._plug_in]

    def _interval_variance(self, lo: int, hi: int) -> float:
        """``variance_of(1[lo <= leaf < hi])`` without dense arrays.

        For an interval, ``ub_j`` is the covered fraction of each node, so ``ztd_j`` is non-zero only on the
        children of the <= 2 partially covered parents, and ``zb_j`` (hence ``a_j``) is piecewise constant with
        O(levels * fanout) pieces. Each piece contributes through interval sums of the plug-in masses. Because
        the post-processing reproduces every consistent tree with root n, ``sum_j phi_j = w - const`` on the
        leaves, so the sampling term's ``Var_f(sum_j phi_j)`` is ``F(1 - F)`` with F the interval's mass.
        """
        if hi <= lo or (lo == 0 and hi == 1 << self.bits):
            return 0.0  # empty, or the whole domain: n, known exactly
        alpha, fan, B = self._weights, self._fanout, self.bits
        bounds, values = np.array([0, 1]), np.array([0.0])  # zb on the root level (unused, zero)
        total, sampling_part = 0.0, 0.0
        previous_width = 1 << B
        for j, length in enumerate(self.prefix_lengths):
            width = 1 << (B - length)
            decay = 1.0 - alpha[j - 1] if j else 0.0
            bounds, values = bounds * fan[j], values * decay
            parents = {lo // previous_width, (hi - 1) // previous_width}
            nodes, deltas = [], []
            for parent in sorted(parents):
                start, end = parent * previous_width, (parent + 1) * previous_width
                cover_parent = (min(hi, end) - max(lo, start)) / previous_width
                if not 0.0 < cover_parent < 1.0:
                    continue
                children = parent * fan[j] + np.arange(fan[j])
                left = np.maximum(lo, children * width)
                right = np.minimum(hi, (children + 1) * width)
                nodes.append(children)
                deltas.append(np.maximum(right - left, 0) / width - cover_parent)
            if nodes:
                u, d = np.concatenate(nodes), np.concatenate(deltas)
                merged = np.union1d(bounds, np.concatenate((u, u + 1)))
                starts = merged[:-1]
                base = values[np.searchsorted(bounds, starts, side="right") - 1]
                pos = np.minimum(np.searchsorted(u, starts), u.size - 1)
                bounds, values = merged, base + np.where(u[pos] == starts, d[pos], 0.0)
            a = alpha[j] * values
            lengths = np.diff(bounds)
            cum = self._plug_in_cumulative[j]
            mass = cum[bounds[1:]] - cum[bounds[:-1]]
            s1, s2 = float(a @ lengths), float((a * a) @ lengths)
            saf, sa2f = float(a @ mass), float((a * a) @ mass)
            nj, s, beta = self.clients[j], self._scale[j], self.cov_beta[j]
            ldp = self.var_intercept[j] * s2 + self.var_slope[j] * nj * sa2f
            if beta:
                ldp -= nj * beta**2 * (s1**2 - s2) + 2 * beta * nj * (s1 * saf - sa2f)
            total += s**2 * ldp
            sampling_part += s * (sa2f - saf**2)
            previous_width = width
        if self.sampled:
            cum = self._plug_in_cumulative[-1]
            mass_range = cum[hi] - cum[lo]
            total += self._sampling_factor() * (sampling_part - mass_range * (1.0 - mass_range))
        return max(total, 0.0)

    # -- queries ------------------------------------------------------------------------------------

    def _check_bounds(self, lo: np.ndarray, hi: np.ndarray) -> None:
        if np.any(lo < 0) or np.any(hi > (1 << self.bits)) or np.any(lo > hi):
            raise ValueError(f"ranges must satisfy 0 <= lo <= hi <= 2^{self.bits}")

    def answers(self, lo: Sequence[int] | np.ndarray, hi: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Estimated counts of clients with leaf in [lo, hi) and their standard errors, for arrays of ranges."""
        lo_a, hi_a = np.atleast_1d(np.asarray(lo, dtype=np.int64)), np.atleast_1d(np.asarray(hi, dtype=np.int64))
        self._check_bounds(lo_a, hi_a)
        cum = self._cumulative
        estimate = cum[hi_a] - cum[lo_a]
        var = np.array([self._interval_variance(int(a), int(b)) for a, b in zip(lo_a, hi_a, strict=True)])
        return estimate, np.sqrt(var)

    def answer(self, lo: int, hi: int) -> tuple[float, float]:
        """(estimate, stderr) of the number of clients whose leaf lies in [lo, hi)."""
        est, se = self.answers([lo], [hi])
        return float(est[0]), float(se[0])

    def cdf(self, c: int) -> tuple[float, float]:
        """(estimate, stderr) of #{clients with leaf < c}."""
        return self.answer(0, c)

    def cdf_stderr_profile(self, points: int = 33) -> tuple[np.ndarray, np.ndarray]:
        """Exact CDF standard errors at ~2 * points cut points (uniform in c and at estimated CDF quantiles), for
        interpolating se(P(c)) at every c without one O(tree) adjoint per leaf."""
        cache = self.__dict__.setdefault("_profiles", {})
        if points in cache:
            return cache[points]
        size = 1 << self.bits
        uniform = np.linspace(0, size, points).round()
        targets = np.linspace(0, self.n, points)[1:-1]
        at_mass = np.searchsorted(self._cumulative, targets)
        cuts = np.unique(np.clip(np.concatenate((uniform, at_mass)), 0, size).astype(np.int64))
        _, se = self.answers(np.zeros_like(cuts), cuts)
        cache[points] = (cuts, se)
        return cuts, se

    @cached_property
    def monotone_cdf(self) -> np.ndarray:
        """Isotonic (least-squares nondecreasing) fit of P(j + 1), j = 0..2^bits - 1 (docs/mathematics.md §5's
        optional monotonicity step). The consistent CDF is rough at leaf scale, so its FIRST crossing of q n is
        pulled early by the noise maximum over the approach (a first-passage bias of ~1-2 rank stderr); the
        crossing of the isotonic fit is not."""
        weights = np.ones(1 << self.bits)
        weights[-1] = 1e12  # P(2^bits) = n exactly
        fit = isotonic_regression(self._cumulative[1:], weights=weights).x
        return np.clip(fit, 0.0, float(self.n))

    def quantile(self, q: float, z: float = 1.96, profile_points: int = 33) -> QuantileEstimate:
        """q-quantile (0 < q <= 1): the first leaf where the monotone CDF reaches q n, with the exact stderr of the
        linear CDF estimate there as rank error, and ``[lower, upper]`` = the first crossings of the monotone
        CDF -/+ z se (se interpolated between exact profile points)."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"quantile level q must lie in (0, 1], got {q!r}")
        target = q * self.n
        cum = self.monotone_cdf
        cuts, se_cuts = self.cdf_stderr_profile(profile_points)
        se = np.interp(np.arange(1, cum.size + 1), cuts, se_cuts)

        def first(values: np.ndarray) -> int:
            hit = values >= target * (1 - 1e-12)
            return int(np.argmax(hit)) if hit.any() else cum.size - 1

        leaf = first(cum)
        return QuantileEstimate(q=float(q), leaf=leaf, rank=float(cum[leaf]), rank_stderr=self.cdf(leaf + 1)[1],
                                lower=first(cum + z * se), upper=first(cum - z * se), z=float(z))

    def median(self, z: float = 1.96) -> QuantileEstimate:
        return self.quantile(0.5, z)

    # -- rows ---------------------------------------------------------------------------------------

    def raw_stderr(self, j: int) -> np.ndarray:
        """Marginal standard error of the raw estimates of level j (plug-in at the clipped raw estimate)."""
        s, nj = self._scale[j], self.clients[j]
        c = np.clip(self.raw[j] / s, 0.0, nj)
        var = s**2 * (self.var_intercept[j] + self.var_slope[j] * c)
        f = np.clip(self.raw[j] / self.n, 0.0, 1.0)
        return np.sqrt(var + self._sampling_factor() * (s - 1.0) * f * (1.0 - f))

    def to_rows(self) -> np.ndarray:
        """Root row (level 0, estimate n) then every node, with ``ROW_DTYPE``."""
        size = 1 + sum(1 << b for b in self.prefix_lengths)
        rows = np.zeros(size, dtype=ROW_DTYPE)
        rows[0] = (0, 0, float(self.n), 0.0, self.n, 0.0, 0.0, 0.0)
        at = 1
        for j, length in enumerate(self.prefix_lengths):
            part = rows[at : at + (1 << length)]
            part["level"], part["index"] = length, np.arange(1 << length)
            part["estimate"], part["stderr"] = self.raw[j], self.raw_stderr(j)
            part["clients"] = self.clients[j]
            part["var_intercept"], part["var_slope"] = self.var_intercept[j], self.var_slope[j]
            part["cov_beta"] = self.cov_beta[j]
            at += 1 << length
        return rows

    @classmethod
    def from_rows(cls, rows: np.ndarray | Mapping[str, Any]) -> RangeTree:
        """Rebuild from ``to_rows()`` output, or any mapping of its columns (e.g. a Parquet table's columns)."""
        cols = {name: np.asarray(rows[name]) for name in ROW_DTYPE.names}
        level, index = cols["level"].astype(np.int64), cols["index"].astype(np.int64)
        root = np.flatnonzero(level == 0)
        if root.size != 1:
            raise ValueError(f"rows need exactly one root row (level 0), found {root.size}")
        n = int(cols["clients"][root[0]])
        lengths = sorted(int(x) for x in np.unique(level[level > 0]))
        raw, clients, icpt, slope, beta = [], [], [], [], []
        for length in lengths:
            sel = np.flatnonzero(level == length)
            order = sel[np.argsort(index[sel])]
            if not np.array_equal(index[order], np.arange(1 << length)):
                raise ValueError(f"level {length} must have one row per index 0..2^{length}-1")
            raw.append(cols["estimate"][order].astype(np.float64))
            for out, name in ((clients, "clients"), (icpt, "var_intercept"), (slope, "var_slope"), (beta, "cov_beta")):
                values = np.unique(cols[name][order])
                if values.size != 1:
                    raise ValueError(f"column {name} must be constant within level {length}")
                out.append(values[0].item())
        return cls(prefix_lengths=tuple(lengths), n=n, clients=tuple(int(c) for c in clients), raw=tuple(raw),
                   var_intercept=tuple(icpt), var_slope=tuple(slope), cov_beta=tuple(beta))
