"""Per-mechanism shuffle bound from the privacy blanket (docs/mathematics.md §1.2, "blanket pair").

Balle, Bell, Gascón and Nissim (*The Privacy Blanket of the Shuffle Model*, CRYPTO 2019) write every report as
a draw from a law ω common to all inputs with probability γ (the blanket) and input-dependent otherwise; γ is
at most the mass common to all inputs, Σ_y min_x P(y | x). Reveal to the adversary which of the n - 1 other
clients drew from the blanket, and what the rest reported (their inputs are worst-case and known): the
release is a post-processing of the victim's report shuffled among S ~ Bin(n - 1, γ) blanket draws, S
revealed. A ``BlanketDecomposition`` says how those draws and the victim's report split against one
neighbouring pair (x, x'): a blanket draw is of x's kind (law A) or x''s kind (law B) with probability
``clone / 2`` each, and of a leftover law L otherwise; the victim reports A / B / L with weights ``w1`` /
``w2`` / ``w0`` under x (``w1``, ``w2`` swapped under x') and, with the remaining weight, from a part equal
under x and x', which is revealed (loss 0). Because the victim's leftover law is the blanket draws' leftover
law L, the multiset of (kind, value) is a post-processing of the kind counts, so given S the view is the
clone pair (``shuffle_bound.CloneDivergence``) of S others: ``δ(ε) = Σ_S Pr[S] δ_S(ε)``. This is the
reduction that fails for the generic pair at a mechanism's own α (the victim's leftover differs from the
others'); here the leftover is shared by construction. tests/privacy/test_blanket_shuffle.py checks every
declared decomposition by linear programming over the mechanism's exact output table (every input pair),
and the bound against exactly enumerated shuffled crowds.

Fast: δ_S never grows with S (one more blanket draw is a post-processing: draw it and shuffle it in), so S
is grouped into buckets, each evaluated at its smallest S (an upper bound); S outside mean ± 12 sd goes
to δ. Every bucket's pair is concatenated into one array (the divergence is linear in the pair's weights),
so one bisection costs what one clone pair of the same size does.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

from ._checks import check_delta, check_epsilon, check_int, check_real
from .binomial import binom_cdf, binom_pmf, binom_sf
from .bisection import smallest_certified_fast
from .shuffle_bound import CloneDivergence, epsilon_central, pair_terms

__all__ = [
    "BOUND_BLANKET",
    "BOUND_GENERIC",
    "BlanketDecomposition",
    "BlanketShuffleDivergence",
    "best_epsilon",
    "blanket_buckets",
    "blanket_grr",
    "blanket_hadamard",
    "blanket_olh",
    "blanket_oue",
    "blanket_shuffle_pld",
    "epsilon_blanket_shuffle",
]

BOUND_GENERIC = "generic clone pair"  # Feldman, McMillan, Talwar 2023 at alpha = 1/(e^eps + 1)
BOUND_BLANKET = "blanket pair"  # this module
EXACT_BUCKETS = 512  # up to this many values of S within the window: one bucket each (no rounding at all)
# Bucket edges in standard deviations of S (fine in the bulk, coarse in the tails, where little mass sits).
_FINE_EDGES = np.concatenate([[-10.0, -8.0, -6.5, -5.5, -4.75], np.arange(-4.0, 4.0001, 0.5),
                              [4.75, 5.5, 6.5, 8.0, 10.0]])
# The PLD's buckets: fewer (every bucket is a full pair's worth of points), and at most this many exact values.
# Six buckets cost ~1.3 s at README's demo crowd (n = 49,969) and lose 0.2% against the exact mixture.
_PLD_EDGES = np.array([-10.0, -4.0, -2.5, -1.5, -0.75, 0.0, 10.0])
PLD_EXACT_BUCKETS = 6
BLANKET_WINDOW_SDS = 10.0  # each bucket's m window: beyond 10 sd lies < 1e-22 of mass, added to delta anyway


@dataclass(frozen=True)
class BlanketDecomposition:
    """Blanket weight ``gamma``, the blanket draws' clone probability and the victim's weights (module doc).

    Valid for a randomizer when, for every input pair (x, x'), laws A, B, L exist with every report's law at
    least ``gamma`` ((clone/2)(A + B) + (1 - clone) L) and R(x) = t (w1 A + w2 B + w0 L) + M, R(x') = t (w2 A +
    w1 B + w0 L) + M for one t in (0, 1] and one M >= 0 (t < 1: the pair is a post-processing of the declared
    one, mixed with an outcome equal under both inputs). ``rule`` says where the numbers come from.
    """

    gamma: float
    clone: float
    w1: float
    w2: float
    w0: float
    rule: str = ""
    # Optional pair classes: every input pair is covered by one of them (each a decomposition itself). The
    # divergence of a pair is at most its class's, so eps at delta may be the largest over the classes, often
    # below the cover's; the loss distribution (one for every pair) stays the cover's.
    classes: tuple[BlanketDecomposition, ...] = ()

    def __post_init__(self) -> None:
        for name in ("gamma", "clone", "w1", "w2", "w0"):
            value = check_real(name, getattr(self, name))
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
        if self.gamma <= 0.0 or self.clone <= 0.0:
            raise ValueError("gamma and clone must be > 0 (no blanket: use the generic clone pair)")
        if self.w1 < self.w2:
            raise ValueError(f"w1 must be >= w2 (x's kind is the likelier under x), got {self.w1!r} < {self.w2!r}")
        if self.w1 + self.w2 + self.w0 > 1.0 + 1e-12:
            raise ValueError("the victim's weights w1 + w2 + w0 must not exceed 1")

    def as_tuple(self) -> tuple[float, float, float, float, float]:
        """(gamma, clone, w1, w2, w0): what the ledger stores."""
        return (self.gamma, self.clone, self.w1, self.w2, self.w0)


def _inverse_exp_plus(eps: float, offset: float) -> float:
    tail = math.exp(-eps)
    return tail / (1.0 + offset * tail)


def blanket_grr(eps: float, d: int) -> BlanketDecomposition:
    """k-RR over d values: uniform blanket γ = d q; A, B the two inputs' own values (clone 2/d); L uniform on
    the other d - 2 values, where the victim also puts q on each (w0 = (d - 2) q)."""
    eps = check_epsilon("eps", eps)
    d = check_int("d", d, 2)
    q = _inverse_exp_plus(eps, d - 1.0)
    p = 1.0 - (d - 1) * q
    return BlanketDecomposition(d * q, 2.0 / d, p, q, (d - 2) * q, f"k-RR d={d}: gamma = d/(e^eps + d - 1)")


def blanket_oue(eps: float) -> BlanketDecomposition:
    """OUE (true bit Bern(1/2), others Bern(q), q = 1/(1 + e^eps)): blanket Bern(q)^d of weight 1/(2(1 - q));
    on the pair's two bits, A = (1, 0) and B = (0, 1) (clone 2q(1 - q)), L = {(1,1), (0,0)} in proportion
    q^2 : (1-q)^2, of which the victim's (q/2, (1-q)/2) holds w0 = (q^2 + (1-q)^2)/(2(1 - q))."""
    eps = check_epsilon("eps", eps)
    q = _inverse_exp_plus(eps, 1.0)
    return BlanketDecomposition(0.5 / (1.0 - q), 2.0 * q * (1.0 - q), 0.5 * (1.0 - q), 0.5 * q,
                                (q * q + (1.0 - q) ** 2) / (2.0 * (1.0 - q)), "OUE: gamma = (1 + e^eps)/(2 e^eps)")


def blanket_hadamard(eps: float) -> BlanketDecomposition:
    """Hadamard response (p* = e^eps/(1 + e^eps) on the codeword support, K/2 outputs): uniform blanket of
    weight 2(1 - p*); A, B the K/4 outputs in one support only (clone 1/2), L the K/2 outputs in both or
    neither, where the victim holds at least 1 - p*."""
    eps = check_epsilon("eps", eps)
    low = _inverse_exp_plus(eps, 1.0)  # 1 - p*
    return BlanketDecomposition(2.0 * low, 0.5, 0.5 * (1.0 - low), 0.5 * low, low,
                                "Hadamard response: gamma = 2/(1 + e^eps)")


def blanket_olh_classes(eps: float, g: int, collisions: list[float], classes: int = 8
                        ) -> BlanketDecomposition | None:
    """OLH's cover over every observed pairwise collision rate, with the rates split into ``classes`` equal
    intervals, each the cover of the rates it holds (``BlanketDecomposition.classes``)."""
    rates = sorted({float(c) for c in collisions})
    if not rates:
        return None
    cover = blanket_olh(eps, g, rates[0], rates[-1])
    if cover is None:
        return None
    edges = np.linspace(rates[0], rates[-1], classes + 1)
    groups = [[c for c in rates if (lo <= c < hi) or (i == classes - 1 and c == hi)]
              for i, (lo, hi) in enumerate(itertools.pairwise(edges))]
    parts = tuple(blanket_olh(eps, g, group[0], group[-1]) for group in groups if group)
    return dataclasses.replace(cover, classes=tuple(p for p in parts if p is not None) if None not in parts else ())


def blanket_olh(eps: float, g: int, collision_min: float, collision_max: float) -> BlanketDecomposition | None:
    """OLH (GRR over g buckets of a public seeded hash): uniform blanket over (seed, bucket), q per cell.

    For a pair colliding on a fraction c of the seeds, A / B are the pair's own buckets on the other seeds and
    L is q on every remaining cell (colliding seeds included, where the victim's extra p - q is equal under
    both inputs: revealed). Per other client that is q (1 - c) of each kind and q (g - 2 + 2c) of L; the
    victim has (1 - c) p / (1 - c) q of the kinds and q (g - 2 + 2c) of L. One decomposition covers every pair
    of the family: the blanket keeps the kinds of ``collision_max`` and the L of ``collision_min``, the
    victim the weights of ``collision_min`` (a pair with more collisions is that pair scaled by t = (1 - c) /
    (1 - collision_min) plus an equal part). None when some pair always collides (no kind left)."""
    eps = check_epsilon("eps", eps)
    g = check_int("g", g, 2)
    c_min, c_max = check_real("collision_min", collision_min), check_real("collision_max", collision_max)
    if not 0.0 <= c_min <= c_max <= 1.0:
        raise ValueError(f"need 0 <= collision_min <= collision_max <= 1, got {c_min!r}, {c_max!r}")
    if c_max >= 1.0:
        return None
    q = _inverse_exp_plus(eps, g - 1.0)
    p = 1.0 - (g - 1) * q
    kinds, rest = 2.0 * q * (1.0 - c_max), q * (g - 2.0 + 2.0 * c_min)
    keep = 1.0 - c_min
    return BlanketDecomposition(kinds + rest, kinds / (kinds + rest), keep * p, keep * q, rest,
                                f"OLH g={g}: q per (seed, bucket), seeds colliding {c_min:.4g}..{c_max:.4g}")


def blanket_buckets(n: int, gamma: float, *, edges: np.ndarray = _FINE_EDGES, exact: int = EXACT_BUCKETS
                    ) -> tuple[np.ndarray, np.ndarray, float]:
    """(smallest S of each bucket, Pr[S in bucket], Pr[S outside every bucket]) for S ~ Bin(n - 1, gamma).

    Buckets cover mean ± edges[-1] sd; with at most ``exact`` values there, each S is its own bucket."""
    trials = check_int("n", n, 2) - 1
    if gamma >= 1.0:
        return np.array([trials]), np.array([1.0]), 0.0
    mean, sd = trials * gamma, math.sqrt(trials * gamma * (1.0 - gamma))
    lo = max(0, math.floor(mean + edges[0] * sd))
    hi = min(trials, math.ceil(mean + edges[-1] * sd))
    outside = float(binom_cdf(lo - 1, trials, gamma) + binom_sf(hi, trials, gamma))
    if hi - lo + 1 <= exact:
        s = np.arange(lo, hi + 1)
        return s, binom_pmf(s, trials, gamma), outside
    inner = np.floor(mean + edges[1:-1] * sd).astype(np.int64)
    cuts = np.unique(np.concatenate([[lo], np.clip(inner, lo, hi + 1), [hi + 1]]))  # bucket i: [cuts[i], cuts[i+1])
    starts, ends = cuts[:-1], cuts[1:] - 1
    # Pr[start <= S <= end] from the nearer tail (no cancellation of the small tail probabilities).
    low_side = binom_cdf(ends, trials, gamma) - binom_cdf(starts - 1, trials, gamma)
    high_side = binom_sf(starts - 1, trials, gamma) - binom_sf(ends, trials, gamma)
    weights = np.where(ends < mean, low_side, high_side)
    return starts, np.maximum(weights, 0.0), outside


def blanket_terms(n: int, dec: BlanketDecomposition, window_sds: float | None, **bucketing: object
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """The blanket pair as concatenated clone-pair terms: (m, A1, A2, Pr[S] of each term's bucket, mass to δ).

    The last value is what is left out (S outside the buckets, each bucket's m outside its window), an
    upper bound on what it contributes to the divergence (P-mass)."""
    starts, weights, outside = blanket_buckets(n, dec.gamma, **bucketing)  # type: ignore[arg-type]
    ms, a1s, a2s, ws = [], [], [], []
    for s, w in zip(starts.tolist(), weights.tolist(), strict=True):
        if w <= 0.0:
            continue
        m, a1, a2, neglected = pair_terms(int(s), dec.clone, dec.w1, dec.w2, dec.w0, window_sds)
        outside += w * neglected
        ms.append(m)
        a1s.append(a1 * w)
        a2s.append(a2 * w)
        ws.append(np.full(m.shape, w))
    return np.concatenate(ms), np.concatenate(a1s), np.concatenate(a2s), np.concatenate(ws), outside


class BlanketShuffleDivergence(CloneDivergence):
    """``eps_c -> δ`` of n shuffled reports of a randomizer with blanket decomposition ``dec`` (an upper bound:
    buckets at their smallest S, the left-out mass added)."""

    def __init__(self, n: int, dec: BlanketDecomposition, *, window_sds: float | None = BLANKET_WINDOW_SDS) -> None:
        self.n = check_int("n", n, 2)
        self.decomposition = dec
        m, a1, a2, _, self.neglected_mass = blanket_terms(self.n, dec, window_sds)
        self._set_terms(m, a1, a2)


def epsilon_blanket_shuffle(n: int, dec: BlanketDecomposition, eps_local: float, delta: float,
                            tolerance: float = 1e-9) -> float:
    """Smallest certified central ε (replacement) of the blanket pair, in [0, eps_local] (bisection, upper end;
    eps_local itself if even it is not certified: shuffling never hurts; within ``tolerance`` of the smallest)."""
    delta = check_delta("delta", delta)
    eps_local = check_epsilon("eps_local", eps_local)
    divergence = BlanketShuffleDivergence(n, dec)
    return smallest_certified_fast(divergence, eps_local, delta, check_real("tolerance", tolerance))


CLASSES_MAX_N = 60_000  # above this the pair classes are not evaluated (each costs a blanket pair: 1.3 s for 8 at 5e4)


def best_epsilon(n: int, alpha: float, eps_local: float, delta: float,
                 dec: BlanketDecomposition | None = None, *, bounds: dict[str, float] | None = None
                 ) -> tuple[float, str]:
    """(the smallest valid central ε, the bound that gave it): the generic clone pair always, the blanket pair
    where the mechanism declares a decomposition (its pair classes too, up to ``CLASSES_MAX_N``: the largest
    over the classes). All are guarantees for the same pairs; the smallest holds. ``bounds``, if given, gets
    each bound's ε by name. The published figure goes through ``events.central_epsilon``, which calls this."""
    eps, name, each = _best_epsilon(n, alpha, eps_local, delta, dec)
    if bounds is not None:
        bounds.update(each)
    return eps, name


@lru_cache(maxsize=256)
def _best_epsilon(n: int, alpha: float, eps_local: float, delta: float, dec: BlanketDecomposition | None
                  ) -> tuple[float, str, tuple[tuple[str, float], ...]]:
    """``best_epsilon``'s work, cached: the analyzer asks it of one window up to three times (the row, the
    colluders' what-if, the odometer's choice of pair), each 0.2-0.9 s at n = 10^4-10^5."""
    generic = epsilon_central(n, alpha, eps_local, delta)
    if dec is None:
        return generic, BOUND_GENERIC, ((BOUND_GENERIC, generic),)
    blanket = epsilon_blanket_shuffle(n, dec, eps_local, delta)
    if dec.classes and n <= CLASSES_MAX_N:
        blanket = min(blanket, max(epsilon_blanket_shuffle(n, c, eps_local, delta) for c in dec.classes))
    each = ((BOUND_GENERIC, generic), (BOUND_BLANKET, blanket))
    return (blanket, BOUND_BLANKET, each) if blanket < generic else (generic, BOUND_GENERIC, each)


def blanket_pld_fits(n: int, dec: BlanketDecomposition, interval: float) -> bool:
    """Whether ``blanket_shuffle_pld(n, dec, interval)`` fits ``shuffle_pld.MAX_POINTS`` (counted, not built):
    the odometer chooses between the pairs only where it could build this one."""
    from .shuffle_pld import MAX_POINTS, PLD_WINDOW_SDS, binned_points  # dp_accounting: only when composing

    m, a1, a2, _, _ = blanket_terms(n, dec, PLD_WINDOW_SDS, edges=_PLD_EDGES, exact=PLD_EXACT_BUCKETS)
    return binned_points(m, a1, a2, interval) <= MAX_POINTS


@lru_cache(maxsize=64)
def blanket_shuffle_pld(n: int, dec: BlanketDecomposition, interval: float) -> pld_lib.PrivacyLossDistribution:
    """PLD of the blanket pair of n shuffled reports (a dominating pair: S revealed and rounded down to its
    bucket's smallest value, losses rounded up to ``interval``, everything left out on infinite loss).
    Symmetric, like the generic pair's. Built in chunks; cached: windows repeat."""
    from .shuffle_pld import PLD_WINDOW_SDS, binned_loss, pld_from_binned  # dp_accounting: only when composing

    bucketing = {"edges": _PLD_EDGES, "exact": PLD_EXACT_BUCKETS}
    starts, weights, _ = blanket_buckets(n, dec.gamma, **bucketing)  # type: ignore[arg-type]
    m, a1, a2, _, outside = blanket_terms(n, dec, PLD_WINDOW_SDS, **bucketing)
    pmf, x_out = binned_loss(m, a1, a2, interval)
    # loss 0: the victim's revealed part, and the outcome of no kind at all (victim in L, no blanket clone)
    zero = max(0.0, 1.0 - dec.w1 - dec.w2 - dec.w0)
    zero += dec.w0 * float(np.sum(weights * np.exp(starts * math.log1p(-dec.clone)))) if dec.clone < 1.0 else 0.0
    pmf[0] = pmf.get(0, 0.0) + zero
    return pld_from_binned(pmf, outside + x_out, interval)
