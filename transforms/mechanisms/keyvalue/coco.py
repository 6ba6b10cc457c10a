"""CoCo, correlated Collision for mean estimation (docs/mathematics.md §3.2; [CoCo] §7, Alg. 1-2, Lemma 3, Thm 7).

Cells come in ``h = t/2`` pairs ``{p, p + h}``. Key j's plus cell is ``c_j = H_seed(j)`` in [t] (so
``H1(j) = c_j mod h`` and ``H2(j) = +1`` iff ``c_j >= h``: one uniform cell is an independent uniform pair and
orientation); its minus cell is the partner ``c_j +- h``. Each of the client's s writers puts ``e^eps`` on its
item's cell and 1 on the partner, in uniformly random order (a later writer of the same pair overwrites); the
other ``t - 2m`` cells get ``w = (Omega - m(e^eps + 1))/(t - 2m)`` in ``[1, e^eps]`` (t >= 2s + 2), and
``P[z = a] = W[a]/Omega`` with ``Omega = s e^eps + t - s``: eps-LDP.

**Random order = random priorities**: the writer with the largest of s uniform priorities wins its pair, which
is the last writer of a uniformly random order. **Short rows** (``-1`` slots) are filled with *phantom* writers:
a uniformly random cell, i.e. a key with a fully random hash. The overwrite probability ``P_ow`` of §3.2 assumes
exactly s writers; with fewer, real keys would be overwritten less often, ``P_t - P_o`` would grow and the mean
estimator would be biased upwards. Phantoms restore s writers exactly, cost nothing in privacy (every W they
produce has the same bounds) and nothing at the analyzer (nobody's cell is a phantom's, and ``sum W = Omega``
keeps ``P_f = 1/t``).

**Estimators** (Alg. 2) from ``plus_j = C(c_j)``, ``minus_j = C(partner)``: mean ``(plus - minus)/(n(P_t - P_o))``,
non-missing ``(plus + minus - 2n P_f)/(n(P_t + P_o - 2P_f))``, ``f(j+-) = (nonmissing +- mean)/2``. Per-key
variances (Lemma 3 per key, divided by n) and the mean/non-missing covariance are exact under a fully random
hash: a user's ``(A, B) = (1[z = c_j], 1[z = partner])`` has probabilities ``(P_t, P_o)``, ``(P_o, P_t)`` or
``(P_f, P_f)`` by class, independently across users. Key sampling (``max_keys``) mixes a holder's pair with
``(P_f, P_f)`` w.p. ``1 - s/max_keys``; the seed family and its bias term are discussed in ``collision_common``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.stats import binom

from transforms.mechanisms.base import KeyValueEstimate, Randomness
from transforms.mechanisms.frequency.counting import exp_epsilon, structured
from transforms.mechanisms.keyvalue.collision_common import (
    CollisionFamily,
    check_sparse_items,
    complement_rank,
    debiased_square_sum,
    family_cells,
    family_share,
    gather_support,
    occupancy,
    postprocess_estimate,
    search_limit,
)
from transforms.mechanisms.keyvalue.kv_moments import kv_estimate, plug_in_frequencies

__all__ = ["CoCo", "coco_paper_t", "coco_probabilities", "coco_total_variance", "coco_variance_t"]

MAX_ENUMERATED = 1 << 16  # seeds x phantom combinations in exact_output_distribution


def coco_probabilities(s: int, epsilon: float, t: Any) -> tuple[Any, Any, Any, Any]:
    """``(P_ow, P_t, P_o, P_f)`` of §3.2 for s writers (``P_t + P_o = (e^eps + 1)/Omega``, not the
    ``(e^eps + 1)/(2 Omega)`` printed in [CoCo]); floats, or arrays when ``t`` is an array."""
    e = exp_epsilon(epsilon)
    t = np.asarray(t, dtype=np.float64)
    omega = s * e + t - s
    p_ow = 1.0 - t * -np.expm1(s * np.log1p(-2.0 / t)) / (2.0 * s)
    shared = p_ow * (e + 1.0) / (2.0 * omega)
    out = (p_ow, shared + (1.0 - p_ow) * e / omega, shared + (1.0 - p_ow) / omega, 1.0 / t)
    return tuple(float(x) for x in out) if t.ndim == 0 else out


def coco_total_variance(d: int, s: int, epsilon: float, t: Any, target: str = "mean") -> Any:
    """``n sum_j Var`` of the mean (or ``target="nonmissing"``) estimator for s keys per user (Lemma 3)."""
    _, pt, po, pf = coco_probabilities(s, epsilon, t)
    if target == "mean":
        return (s * ((pt + po) - (pt - po) ** 2) + (d - s) * 2 * pf) / (pt - po) ** 2
    both = pt + po
    return (s * both * (1 - both) + (d - s) * 2 * pf * (1 - 2 * pf)) / (both - 2 * pf) ** 2


def _even_at_least(t: float, s: int) -> int:
    t = max(math.ceil(t), 2 * s + 2)
    return t + (t % 2)


def coco_paper_t(s: int, epsilon: float) -> int:
    """[CoCo] Thm 7's mean-estimator rule ``ceil(e^eps s + s + 2)``, rounded up to even and >= 2s + 2
    (the algorithm needs an even t)."""
    return _even_at_least(exp_epsilon(epsilon) * s + s + 2, s)


def coco_variance_t(d: int, s: int, epsilon: float) -> int:
    """The even t >= 2s + 2 minimising the total variance of the mean estimator [D]."""
    ts = np.arange(2 * s + 2, search_limit(s, epsilon) + 1, 2)
    return int(ts[np.argmin(coco_total_variance(d, s, epsilon, ts))])


@dataclass(frozen=True)
class CoCo(CollisionFamily):
    """CoCo ([CoCo] §7): Collision with paired cells, ~15-20 % lower mean-estimation variance than Collision.

    ``t`` (even, >= 2s + 2) defaults to ``t_rule``: ``"variance"`` (minimise the mean estimator's total variance)
    or ``"paper"`` (Thm 7's mean rule). Other parameters as for
    :class:`~transforms.mechanisms.keyvalue.collision.Collision`.
    Estimate extras: ``plus``/``minus`` [d] supports, ``family_variance`` {mean, nonmissing}, ``family_share``
    (mean estimator), ``t``.
    """

    name: ClassVar[str] = "coco"
    payload_kind: ClassVar[str] = "hashed"

    def _default_t(self, rule: str) -> int:
        if rule == "variance":
            return coco_variance_t(self.d, self.s, self.epsilon)
        return coco_paper_t(self.s, self.epsilon)

    def _t_bounds(self) -> tuple[int, str, bool]:
        return 2 * self.s + 2, "2s + 2", True

    @property
    def half(self) -> int:
        """Number of cell pairs ``h = t/2``."""
        return self.cells // 2

    @property
    def probabilities(self) -> tuple[float, float, float, float]:
        """``(P_ow, P_t, P_o, P_f)`` for s writers, before key sampling."""
        return coco_probabilities(self.s, self.epsilon, self.cells)

    @property
    def held_probabilities(self) -> tuple[float, float, float]:
        """``(P_t', P_o', P_f)``: a holder's probabilities with key sampling mixed in."""
        _, pt, po, pf = self.probabilities
        k = self.keep
        return k * pt + (1 - k) * pf, k * po + (1 - k) * pf, pf

    def encode(self, items: np.ndarray, rng: Randomness) -> np.ndarray:
        """Algorithm 1 with random priorities and phantom writers; six draws whose shapes depend on n and s only."""
        arr = check_sparse_items(items, self.d, self.s)
        n, t, h, e = arr.shape[0], self.cells, self.half, exp_epsilon(self.epsilon)
        seed = rng.integers(0, self.seed_family, n)
        priority = rng.random((n, self.s))
        phantom = rng.integers(0, t, (n, self.s))
        branch = rng.random(n)
        pick = rng.random(n)
        plus = family_cells(self.hash_seed, seed[:, None], np.maximum(arr, 0) >> 1, t)
        own = np.where(arr & 1, plus, np.where(plus < h, plus + h, plus - h))
        writer = np.where(arr >= 0, own, phantom)  # the cell each writer sets to e^eps
        pair = np.where(writer < h, writer, writer - h)
        order = np.argsort(pair + priority, axis=1)  # within a pair, the last one has the top priority
        pair = np.take_along_axis(pair, order, axis=1)
        writer = np.take_along_axis(writer, order, axis=1)
        last = np.ones_like(pair, dtype=bool)
        last[:, :-1] = pair[:, :-1] != pair[:, 1:]
        m = last.sum(axis=1)
        rank = rng.integers(0, t - 2 * m, n) if n else np.zeros(0, dtype=np.int64)
        winners = np.sort(np.where(last, writer, t), axis=1)
        chosen = winners[np.arange(n), np.minimum((pick * m).astype(np.int64), m - 1)]
        partner = np.where(chosen < h, chosen + h, chosen - h)
        free_pair = complement_rank(np.where(last, pair, h), rank >> 1)
        untouched = free_pair + h * (rank & 1)
        u = branch * self.omega
        z = np.where(u < m * e, chosen, np.where(u < m * (e + 1), partner, untouched))
        return structured(self.report_dtype, seed=seed.astype(np.uint32), z=z)

    def moment_variances(self, f_plus: np.ndarray, f_minus: np.ndarray,
                         n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact ``(Var mean_j, Var nonmissing_j, Cov)`` per key at item frequencies ``f(j+), f(j-)`` (fractions)."""
        pt, po, pf = self.held_probabilities
        kd, ks = pt - po, pt + po - 2 * pf
        fp, fm = np.asarray(f_plus, dtype=np.float64), np.asarray(f_minus, dtype=np.float64)
        f0 = 1.0 - fp - fm
        spread = pt + po - (pt - po) ** 2  # Var(A - B) of a holder, either sign
        var_mean = ((fp + fm) * spread + f0 * 2 * pf) / (n * kd**2)
        var_nonmissing = ((fp + fm) * (pt + po) * (1 - pt - po) + f0 * 2 * pf * (1 - 2 * pf)) / (n * ks**2)
        cov = (fp - fm) * (pt * (1 - pt) - po * (1 - po)) / (n * kd * ks)
        return var_mean, var_nonmissing, cov

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Per-item count variance ``n^2 Var[f_hat(j+-)]`` at item counts ``[2d]`` (sampling part, exact)."""
        c = np.asarray(counts, dtype=np.float64) / n
        vm, vn, cov = self.moment_variances(c[1::2], c[0::2], n)
        out = np.empty(2 * self.d)
        out[1::2], out[0::2] = (vn + vm + 2 * cov) / 4, (vn + vm - 2 * cov) / 4
        return out * n**2

    @property
    def family_factors(self) -> tuple[float, float]:
        """(rho_mean, rho_nonmissing): exact / linearised variance over hash functions of a non-holder's
        ``E[A - B]`` and ``E[A + B]`` when the client holds s keys (``collision_common``).

        Mean: the pair of key j holds k of the client's writers (k ~ Bin(s, 1/h)); its winner's orientation is
        a random sign, so the variance is ``E[1(k >= 1)/k]`` against the linearised ``E[k] = s/h``. Non-missing:
        ``(e^eps + 1)/Omega`` if the pair is touched (probability m/h, m ~ occupancy of s writers in h pairs),
        else ``2 w(m)/Omega``.
        """
        e, t, h, s, omega = exp_epsilon(self.epsilon), self.cells, self.half, self.s, self.omega
        k = np.arange(1, s + 1)
        rho_mean = float(np.sum(binom.pmf(k, s, 1 / h) / k) / (s / h))
        m = np.arange(s + 1)
        w = (omega - m * (e + 1)) / (t - 2 * m)
        second = np.sum(occupancy(s, h) * ((m / h) * (e + 1) ** 2 + (1 - m / h) * (2 * w) ** 2)) / omega**2
        linear = s * (1 / h) * (1 - 1 / h) * ((e - 1) / omega) ** 2
        return rho_mean, float((second - (2 / t) ** 2) / linear)

    def family_variances(self, mean_squares: float, nonmissing_squares: float) -> tuple[float, float]:
        """Spread of the finite-family bias of (mean_j, nonmissing_j): ``rho_mean (2/t) sum_k mean_k^2 /
        (S (1 - P_ow)^2)`` and ``rho_nm 2 (t - 2) sum_k nonmissing_k^2 / (S (t - 2s)^2)``."""
        p_ow, t, S = self.probabilities[0], self.cells, self.seed_family
        rho_mean, rho_nm = self.family_factors
        mean = rho_mean * (2 / t) * mean_squares / (S * (1 - p_ow) ** 2)
        return mean, rho_nm * 2 * (t - 2) * nonmissing_squares / (S * (t - 2 * self.s) ** 2)

    def decode_counts(self, counts: np.ndarray, n: int, postprocess: str = "none") -> KeyValueEstimate:
        """Algorithm 2 via the count trick, with exact per-key variances plus the family term."""
        plus, minus = gather_support(counts, self.hash_seed, self.d, self.cells, (0, self.half))
        pt, po, pf = self.held_probabilities
        mean = (plus - minus) / (n * (pt - po))
        nonmissing = (plus + minus - 2 * n * pf) / (n * (pt + po - 2 * pf))
        a, b = (nonmissing + mean) / 2, (nonmissing - mean) / 2
        vm, vn, cov = self.moment_variances(*plug_in_frequencies(a, b), n)
        cap = float(self.max_keys or self.s)
        fam_m, fam_n = self.family_variances(debiased_square_sum(mean, vm, cap),
                                             debiased_square_sum(nonmissing, vn, cap))
        extras: dict[str, Any] = {"plus": plus, "minus": minus, "t": self.cells,
                                  "family_variance": {"mean": fam_m, "nonmissing": fam_n},
                                  "family_share": family_share(fam_m, vm)}
        vm, vn = vm + fam_m, vn + fam_n
        est = kv_estimate(a, b, (vn + vm + 2 * cov) / 4, (vn + vm - 2 * cov) / 4, (vn - vm) / 4, n, counts, extras)
        return postprocess_estimate(est, postprocess, cap)

    def exact_output_distribution(self, items: np.ndarray) -> np.ndarray:
        """P(report == (seed, z) | items), indexed ``seed * t + z``: closed form over the random order (each writer
        of a pair wins it w.p. 1/k), exact average over the phantom cells of empty slots."""
        row = check_sparse_items(np.asarray(items).reshape(1, -1), self.d, self.s)[0]
        real = row[row >= 0]
        t, h, e, omega = self.cells, self.half, exp_epsilon(self.epsilon), self.omega
        empties = self.s - real.size
        if self.seed_family * t**empties > MAX_ENUMERATED:
            raise ValueError(f"enumeration of {self.seed_family} seeds x {t}^{empties} phantoms is too large")
        out = np.zeros((self.seed_family, t))
        for seed in range(self.seed_family):
            plus = family_cells(self.hash_seed, np.array([seed]), real >> 1, t)
            own = np.where(real & 1, plus, (plus + h) % t)
            for phantoms in itertools.product(range(t), repeat=empties):
                writers = np.concatenate([own, np.asarray(phantoms, dtype=np.int64)])
                pairs = writers % h
                w = np.zeros(t)
                for p in np.unique(pairs):
                    mine = writers[pairs == p]
                    w[p] = w[p + h] = 1.0  # each writer wins w.p. 1/k and lifts its own cell to e^eps
                    np.add.at(w, mine, (e - 1.0) / mine.size)
                m = np.unique(pairs).size
                untouched = np.ones(t, dtype=bool)
                untouched[np.concatenate([np.unique(pairs), np.unique(pairs) + h])] = False
                w[untouched] = (omega - m * (e + 1)) / (t - 2 * m)
                out[seed] += w / omega
        return out.ravel() / (self.seed_family * t**empties)
