"""Closed forms of the key-value / sparse-vector mechanisms (docs/mathematics.md §3.1-3.4, §1.2): output-size rules,
mixture parameters alpha and expected squared errors.

They live in the privacy layer so that the planner (which must not import mechanisms) and the mechanisms
(which must agree with the planner) share one copy. Data model: every user holds exactly s of the d keys,
each with a value +-1 (the set ``Y_x`` of §3); "items" are the 2d pairs ``j_+ / j_-``.

Every variance is returned as ``n * sum Var`` (the n-free constant) through ``KVError``; divide by n for the
expected sum of squared errors of n users. Sums over items are exact (not bounds) for Collision, CoCo (over
the hash randomness) and PCKV; PrivKV replaces the random group size N_j by its mean n/d (see
``privkv_error``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import check_epsilon, check_int
from .mixture import alpha_generic, alpha_grr

__all__ = [
    "KVError",
    "alpha_pckv_grr",
    "alpha_pckv_ue",
    "alpha_privkv",
    "coco_best_t",
    "coco_error",
    "coco_rates",
    "coco_t_mean_rule",
    "collision_best_t",
    "collision_error",
    "collision_item_variance",
    "collision_t_paper",
    "pckv_allocation",
    "pckv_error",
    "pckv_grr_probabilities",
    "pckv_ue_probabilities",
    "privkv_error",
    "privkv_probabilities",
]


@dataclass(frozen=True)
class KVError:
    """``n * sum Var`` of the unbiased estimators: ``frequency`` over the 2d items f(j_b), ``mean`` over the d
    means x̄_j = f(j_+) - f(j_-). Divide by n for the expected summed squared error of n users."""

    frequency: float
    mean: float

    def per_users(self, n: int) -> KVError:
        return KVError(self.frequency / n, self.mean / n)


def _check(d: int, s: int, eps: float) -> tuple[int, int, float]:
    d = check_int("d", d, 1)
    s = check_int("s", s, 1)
    if s > d:
        raise ValueError(f"s (non-zeros per user) must be <= d, got s={s}, d={d}")
    return d, s, check_epsilon("eps", eps)


# --- Collision (§3.1) -------------------------------------------------------------------------------------


def collision_t_paper(eps: float, s: int) -> int:
    """[CoCo]'s output size ``t* = floor(s e^eps + 2s - 1)`` (at least s + 1)."""
    eps, s = check_epsilon("eps", eps), check_int("s", s, 1)
    return max(s + 1, math.floor(s * math.exp(eps) + 2 * s - 1))


def collision_item_variance(d: int, s: int, eps: float, t: float | np.ndarray) -> float | np.ndarray:
    """``n * sum_y Var[f̂(y)] = [s p(1-p) + (2d - s) q(1-q)] / (p - q)^2`` with p = e^eps/Omega, q = 1/t:
    exact under fully random hashing (no factor 2, unlike the papers' bound). ``t`` may be an array or a
    non-integer ([Collision]'s continuous optimum)."""
    e = math.exp(eps)
    t = np.asarray(t, dtype=float)
    p = e / (s * e + t - s)
    q = 1.0 / t
    out = (s * p * (1.0 - p) + (2 * d - s) * q * (1.0 - q)) / (p - q) ** 2
    return float(out) if out.ndim == 0 else out


def collision_error(d: int, s: int, eps: float, t: int) -> KVError:
    """Collision: the mean estimator's summed variance equals the item total (the indicators of j_+ and j_-
    in one report are uncorrelated, §3.1)."""
    d, s, eps = _check(d, s, eps)
    t = check_int("t", t, s + 1)
    total = collision_item_variance(d, s, eps, t)
    return KVError(total, total)


def _argmin_int(f, lo: int, hi: int) -> int:
    """Integer argmin of a unimodal vectorised f on [lo, hi]: geometric grids zooming onto the best point.

    t can reach s e^eps ~ 1e13 for large local budgets, so an exhaustive arange is out of the question; the
    variances below are unimodal in t (one interior minimum, growing linearly as t -> infinity).
    """
    while hi - lo > 256:
        grid = np.unique(np.rint(np.geomspace(lo, hi, 257)))
        best = int(np.argmin(f(grid)))
        lo, hi = int(grid[max(best - 1, 0)]), int(grid[min(best + 1, grid.size - 1)])
    grid = np.arange(lo, hi + 1, dtype=float)
    return int(grid[np.argmin(f(grid))])


def _t_search_top(s: int, eps: float, d: int) -> int:
    """Upper end of the t search, far beyond the optimum ~ s (e^eps + 2) (§3.1) and the 50 s of the spec."""
    return max(50 * s, math.ceil(8 * s * (math.exp(eps) + 3) + 4 * d))


def collision_best_t(d: int, s: int, eps: float) -> int:
    """The integer t >= s + 1 minimising ``collision_item_variance``."""
    d, s, eps = _check(d, s, eps)
    return _argmin_int(lambda ts: collision_item_variance(d, s, eps, ts), s + 1, _t_search_top(s, eps, d))


# --- CoCo (§3.2) ------------------------------------------------------------------------------------------


def coco_t_mean_rule(eps: float, s: int) -> int:
    """[CoCo] Thm 7 rule for the mean estimator, ``ceil(e^eps s + s + 2)``, rounded up to even and >= 2s + 2."""
    eps, s = check_epsilon("eps", eps), check_int("s", s, 1)
    t = max(2 * s + 2, math.ceil(math.exp(eps) * s + s + 2))
    return t + (t % 2)


def coco_rates(s: int, eps: float | np.ndarray, t: float | np.ndarray) -> tuple[np.ndarray, ...]:
    """(P_ow, P_t, P_o, P_f) of §3.2; vectorised over eps and t."""
    t = np.asarray(t, dtype=float)
    e = np.exp(eps)
    omega = s * e + t - s
    # 1 - (t^s - (t-2)^s)/(2 s t^(s-1)) = 1 - t (1 - (1 - 2/t)^s)/(2 s), without huge powers.
    p_ow = 1.0 - t * (-np.expm1(s * np.log1p(-2.0 / t))) / (2.0 * s)
    p_true = p_ow * (e + 1.0) / (2.0 * omega) + (1.0 - p_ow) * e / omega
    p_other = p_ow * (e + 1.0) / (2.0 * omega) + (1.0 - p_ow) / omega
    return p_ow, p_true, p_other, 1.0 / t


def _coco_sums(d: int, s: int, eps: float | np.ndarray, t: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n * sum_j Var of (mean, non-missing), [CoCo] Lemma 3 divided by n (the lemma is stated per user)."""
    _, p_true, p_other, p_f = coco_rates(s, eps, t)
    plus, minus = p_true + p_other, p_true - p_other
    mean = (s * (plus - minus**2) + (d - s) * 2.0 * p_f) / minus**2
    present = (s * plus * (1.0 - plus) + (d - s) * 2.0 * p_f * (1.0 - 2.0 * p_f)) / (plus - 2.0 * p_f) ** 2
    return mean, present


def coco_error(d: int, s: int, eps: float, t: int) -> KVError:
    """CoCo: ``mean`` from Lemma 3; the items f̂(j_+-) = (x̂_j +- x̄̂_j)/2 have summed variance
    (Var x̂_j + Var x̄̂_j)/2 per key whatever the covariance, so ``frequency`` is the average of the two sums."""
    d, s, eps = _check(d, s, eps)
    t = check_int("t", t, 2 * s + 2)
    if t % 2:
        raise ValueError(f"CoCo needs an even t, got t={t}")
    mean, present = _coco_sums(d, s, eps, t)
    return KVError(float(mean + present) / 2.0, float(mean))


def coco_best_t(d: int, s: int, eps: float) -> int:
    """The even t >= 2s + 2 minimising the Lemma-3 variance of the mean estimator."""
    d, s, eps = _check(d, s, eps)
    half = _argmin_int(lambda h: _coco_sums(d, s, eps, 2.0 * h)[0], s + 1, _t_search_top(s, eps, d) // 2 + 1)
    return 2 * half


# --- PCKV (§3.4) ------------------------------------------------------------------------------------------


def pckv_allocation(eps: float) -> tuple[float, float]:
    """Default PCKV budget split (eps1 for the key, eps2 for the value): eps2 = eps, eps1 = ln((e^eps + 1)/2),
    whose tight total max{eps2, eps1 + ln(2/(1 + e^-eps2))} is exactly eps."""
    eps = check_epsilon("eps", eps)
    return math.log((math.exp(eps) + 1.0) / 2.0), eps


def pckv_ue_probabilities(eps: float) -> tuple[float, float, float]:
    """(a, b, p) of PCKV-UE: a = 1/2, b = 1/(e^eps1 + 1), value keep probability p = e^eps2/(1 + e^eps2)."""
    eps1, eps2 = pckv_allocation(eps)
    return 0.5, 1.0 / (math.exp(eps1) + 1.0), 1.0 / (1.0 + math.exp(-eps2))


def pckv_grr_probabilities(eps: float, d: int, s: int) -> tuple[float, float, float]:
    """(a, b, p) of PCKV-GRR over d' = d + s keys (s dummy keys, ell = s): a = e^eps1/(e^eps1 + d' - 1),
    b = (1 - a)/(d' - 1)."""
    eps1, eps2 = pckv_allocation(eps)
    d_prime = d + s
    e1 = math.exp(eps1)
    return e1 / (e1 + d_prime - 1.0), 1.0 / (e1 + d_prime - 1.0), 1.0 / (1.0 + math.exp(-eps2))


def alpha_pckv_grr(eps: float, d: int, s: int) -> float:
    """1/(e^eps + 2d' - 1): with the default allocation PCKV-GRR *is* k-RR over the 2d' outputs (k', +-1).

    For a sampled pair <k, v*> the output <k, v*> has probability a p = b e^eps/2, <k, -v*> has a(1 - p) = b/2
    (because e^eps1 = (e^eps + 1)/2) and every other pair b/2: weights e^eps : 1 : ... : 1 over 2d' cells.
    Padding, sampling and discretisation only choose the k-RR input at random per user, which cannot hurt
    (joint convexity), so the k-RR alpha of ``mixture.alpha_grr`` applies with 2d' values.
    """
    d, s, eps = _check(d, s, eps)
    return alpha_grr(eps, 2 * (d + s))


def _ue_symbol_laws(eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PCKV-UE per-position laws over (+1, -1, 0): sampled key with v* = +1, with v* = -1, any other key."""
    a, b, p = pckv_ue_probabilities(eps)
    plus = np.array([a * p, a * (1.0 - p), 1.0 - a])
    return plus, plus[[1, 0, 2]], np.array([b / 2.0, b / 2.0, 1.0 - b])


def alpha_pckv_ue(eps: float) -> float:
    """max TV / (e^eps - 1) for PCKV-UE (the rule of ``mixture.alpha_from_tv``).

    Two sampled pairs produce product laws that differ in at most two positions (their keys), so the worst TV
    is the larger of (same key, opposite values) and (two keys) on those positions' 3 x 3 joint law; the TV
    of the padded/sampled mixtures is at most that (convexity). Independent of d.
    """
    eps = check_epsilon("eps", eps)
    plus, minus, other = _ue_symbol_laws(eps)
    same_key = 0.5 * float(np.abs(plus - minus).sum())
    two_keys = 0.5 * float(np.abs(np.outer(plus, other) - np.outer(other, minus)).sum())
    return max(same_key, two_keys) / math.expm1(eps)


def _pair_error(s: int, d: int, holder: tuple[float, float], other: float, c_sum: float, c_diff: float) -> KVError:
    """Sum over keys of the per-user variance of ``c_sum (I+ + I-)`` and ``c_diff (I+ - I-)``.

    I+ / I- are the exclusive indicators "this report supports (k, +1) / (k, -1)"; a user holds s keys (with
    probabilities ``holder`` for its own sign first) and is a non-holder (``other`` each) of d - s keys. The
    per-sign items are halves of the sum and difference, so their summed variance is the average of the two.
    """
    (h_same, h_opp), (o_same, o_opp) = holder, (other, other)
    var_sum = s * (h_same + h_opp) * (1 - h_same - h_opp) + (d - s) * (o_same + o_opp) * (1 - o_same - o_opp)
    var_diff = s * (h_same + h_opp - (h_same - h_opp) ** 2) + (d - s) * (o_same + o_opp)
    var_sum, var_diff = c_sum**2 * var_sum, c_diff**2 * var_diff
    return KVError((var_sum + var_diff) / 2.0, var_diff)


def pckv_error(variant: str, d: int, s: int, eps: float) -> KVError:
    """PCKV-UE / PCKV-GRR with ell = s and the unbiased linear inversion of §3.4 (exact: pair sampling and
    perturbation are independent across users). ``variant`` is "ue" or "grr"."""
    d, s, eps = _check(d, s, eps)
    if variant == "ue":
        a, b, p = pckv_ue_probabilities(eps)
    elif variant == "grr":
        a, b, p = pckv_grr_probabilities(eps, d, s)
    else:
        raise ValueError(f"variant must be 'ue' or 'grr', got {variant!r}")
    rest = (1.0 - 1.0 / s) * b / 2.0
    holder = (a * p / s + rest, a * (1.0 - p) / s + rest)
    return _pair_error(s, d, holder, b / 2.0, s / (a - b), s / (a * (2.0 * p - 1.0)))


# --- PrivKV (§3.3) ----------------------------------------------------------------------------------------


def privkv_probabilities(eps: float, key_share: float = 0.5) -> tuple[float, float]:
    """(p1, p2) of PrivKV with eps_k = key_share * eps, eps_v = eps - eps_k (default split eps/2 each)."""
    eps = check_epsilon("eps", eps)
    if not 0.0 < key_share < 1.0:
        raise ValueError(f"key_share must lie in (0, 1), got {key_share!r}")
    eps_k = key_share * eps
    return 1.0 / (1.0 + math.exp(-eps_k)), 1.0 / (1.0 + math.exp(-(eps - eps_k)))


def alpha_privkv(eps: float) -> float:
    """The generic 1/(e^eps + 1) (§8.6), eps = eps_k + eps_v being PrivKV's (loose) LDP budget."""
    return alpha_generic(eps)


def privkv_error(d: int, s: int, eps: float, n: int, key_share: float = 0.5) -> KVError:
    """PrivKV with the unbiased per-sign estimator of §3.3, under two stated approximations.

    Each key is sampled by N_j ~ Bin(n, 1/d) users; N_j is replaced by its mean n/d (relative error O(d/n)).
    The sampling term f(1 - f)(n - N_j)/(N_j (n - 1)) depends on the data; it is taken at its maximum over all
    data with s keys per user, reached by uniform supports with random signs (f = s/(2d) for every item; for
    the means f(j_+) = f(j_-)), which is also §3's synthetic workload.
    """
    d, s, eps = _check(d, s, eps)
    n = check_int("n", n, 2)
    p1, p2 = privkv_probabilities(eps, key_share)
    holder = (p1 * p2, p1 * (1.0 - p2))
    noise = _pair_error(s, d, holder, (1.0 - p1) / 2.0, 1.0 / (2.0 * p1 - 1.0), 1.0 / (p1 * (2.0 * p2 - 1.0)))
    # The conditional variance of an estimate over a group of N = n/d users is d/n times the per-user average;
    # KVError is n * sum Var, hence the factor d. The sampling factor (n - N)/(N (n - 1)) is (d - 1)/(n - 1).
    sampling = n * (d - 1) / (n - 1)
    frequency = d * noise.frequency + sampling * s * (1.0 - s / (2.0 * d))
    return KVError(frequency, d * noise.mean + sampling * s)
