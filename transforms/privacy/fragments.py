"""Central accounting of [ESA]'s fragmented unary encodings (docs/mathematics.md §1.2-1.3, §1.4, §2.7, §2.8).

The ledger's ``eps_central`` is **replacement** DP, as for every other mechanism: ``replacement_tight``
composes the two changed channels by privacy loss distributions. The other bounds here are **removal**
central DP of the whole report, the neighbouring relation [ESA] uses: a user's
one-hot vector is replaced by the all-zero reference, which changes the randomized bits of exactly one
attribute channel (bit v). Replacement central DP changes two channels, hence basic composition
``(2 eps_c, 2 delta)`` (``replacement_central``).

* Attribute fragmenting (k-RAPPOR, §2.7): every channel carries binary RR with flip probability
  1/(1+e^eps), so [ESA] Lemma II.6 (``closed_forms.lemma_ii6_rappor``), its simplification Thm III.1 and the tight
  §1.2 bound with alpha = 1/(e^eps+1) (``rappor_tight``) all certify the report.
* Report fragmenting with a backstop (§2.8): the shuffled fragments of bit j are a post-processing of the
  shuffled backstop bits of channel j (given their count, each fragment row is Bin(m, p_f) + Bin(n-m, q_f)), so
  every rappor bound at eps_b holds. The tau fragments of one bit, taken together, are a binary-input
  randomizer with LDP eps(tau) ([ESA] Thm IV.1), and separately shuffled rows are a post-processing of jointly
  shuffled per-user tuples, so the tight bound at (eps(tau), 1/(e^eps(tau)+1)) holds too (``fragments_tight``).
  [ESA] Thm IV.2 as printed (``theorem_iv2``) and the row-composition recomputation of docs/mathematics.md §2.8
  (``fragment_rows_bound``) are reported for comparison only (see their docstrings for why).
"""

from __future__ import annotations

import math

from ._checks import check_delta, check_epsilon, check_int
from .closed_forms import ClosedForm, lemma_ii6, rappor_flip_lambda
from .composition import basic_composition, bun_steinke_composition, fragment_epsilon
from .mixture import alpha_binary_rr
from .shuffle_bound import epsilon_central

__all__ = [
    "default_fragment_epsilon",
    "fragment_alpha",
    "fragment_rows_bound",
    "fragments_tight",
    "rappor_tight",
    "replacement_central",
    "replacement_tight",
    "theorem_iv2",
]


def default_fragment_epsilon(eps_b: float, tau: int) -> float:
    """Fragment budget eps_f of docs/mathematics.md §2.8's default rule [D]: the fragment-stage variance term
    ``e^eps_f/(tau (e^eps_f - 1)^2)`` equals the backstop's ``e^eps_b/(e^eps_b - 1)^2``.

    With ``e^x/(e^x - 1)^2 = 1/(4 sinh^2(x/2))`` the equation is ``sinh(eps_f/2) = sinh(eps_b/2)/sqrt(tau)``,
    solved here in closed form (the tests check it against a numerical root). tau = 1 gives eps_f = eps_b.
    [ESA] does not publish its own rule; its (eps_b, eps_f) pairs are not reproduced by this one.
    """
    eps_b = check_epsilon("eps_b", eps_b)
    tau = check_int("tau", tau, 1)
    return 2.0 * math.asinh(math.sinh(eps_b / 2.0) / math.sqrt(tau))


def fragment_alpha(eps_b: float, eps_f: float, tau: int) -> float:
    """Mixture alpha of the tau-tuple of one bit's fragments: the generic 1/(e^eps(tau) + 1) (valid for any
    eps(tau)-LDP randomizer; the tuple's exact TV would give a slightly smaller, also valid, alpha)."""
    return alpha_binary_rr(fragment_epsilon(eps_b, eps_f, tau))


def rappor_tight(n: int, eps: float, delta: float) -> float:
    """Tight §1.2 removal central epsilon of attribute-fragmented k-RAPPOR: one channel, n binary RRs with
    alpha = 1/(e^eps + 1). Valid for any eps (no validity window, unlike Lemma II.6)."""
    eps = check_epsilon("eps", eps)
    return epsilon_central(n, alpha_binary_rr(eps), eps, delta)


def fragments_tight(n: int, eps_b: float, eps_f: float, tau: int, delta: float) -> float:
    """Tight §1.2 removal central epsilon of report fragmenting, from the per-bit fragment tuple
    (LDP eps(tau), alpha = 1/(e^eps(tau) + 1)); never worse than the tight bound of the backstop alone."""
    eps_tuple = fragment_epsilon(check_epsilon("eps_b", eps_b), check_epsilon("eps_f", eps_f), check_int("tau", tau, 1))
    return epsilon_central(n, alpha_binary_rr(eps_tuple), eps_tuple, delta)


def theorem_iv2(n: int, eps_b: float, eps_f: float, tau: int, delta: float) -> ClosedForm:
    """[ESA] Thm IV.2 exactly as printed (ln for log):
    ``min{ sqrt(8 tau eps_f ln^2(tau eps_f/delta)/n), sqrt(64 e^eps_b ln(4/delta)/n) }`` for eps_f > 1, delta < 1/2.

    Comparison only: the first term is linear in eps_f where amplification bounds
    scale with e^eps_f, and its proof composes rows that share the backstop; the second is Thm III.1 applied to
    the backstop without that theorem's eps window. ``fragment_rows_bound`` is the recomputation.
    """
    n = check_int("n", n, 2)
    eps_b = check_epsilon("eps_b", eps_b)
    eps_f = check_epsilon("eps_f", eps_f)
    tau = check_int("tau", tau, 1)
    delta = check_delta("delta", delta)
    name = "theorem_iv2"
    if eps_f <= 1.0:
        return ClosedForm(name, None, f"requires eps_f > 1 (got eps_f={eps_f:g})")
    if delta >= 0.5:
        return ClosedForm(name, None, f"requires delta < 1/2 (got delta={delta:g})")
    rows = math.sqrt(8.0 * tau * eps_f * math.log(tau * eps_f / delta) ** 2 / n)
    backstop = math.sqrt(64.0 * math.exp(eps_b) * math.log(4.0 / delta) / n)
    return ClosedForm(name, min(rows, backstop))


def fragment_rows_bound(n: int, eps_b: float, eps_f: float, tau: int, delta: float) -> ClosedForm:
    """docs/mathematics.md §2.8's recomputation of Thm IV.2's first term [D]: each fragment row is binary RR with
    the composite budget eps(1), so Lemma II.6 with lambda = 2n/(1 + e^eps(1)) and delta/(2 tau) per row; then
    tau-fold composition with slack delta/2 (Bun-Steinke = [ESA] Thm II.7, or basic if smaller / if Bun-Steinke's
    logarithm is undefined). tau = 1 is Lemma II.6 at delta.

    Comparison only: like [ESA]'s proof it treats the rows as an adaptive composition, but the rows share each
    user's backstop, so the conditional law of one row given the others is not the per-row RR the
    composition theorem needs. Not used as a ledger value.
    """
    n = check_int("n", n, 2)
    eps_one = fragment_epsilon(check_epsilon("eps_b", eps_b), check_epsilon("eps_f", eps_f), 1)
    tau = check_int("tau", tau, 1)
    delta = check_delta("delta", delta)
    name = "fragment_rows"
    if tau == 1:
        row = lemma_ii6(n, rappor_flip_lambda(n, eps_one), delta)
        return ClosedForm(name, row.epsilon, row.reason)
    row = lemma_ii6(n, rappor_flip_lambda(n, eps_one), delta / (2.0 * tau))
    if row.epsilon is None:
        return ClosedForm(name, None, f"per-row Lemma II.6 at delta/(2 tau): {row.reason}")
    eps_basic, _ = basic_composition([(row.epsilon, delta / (2.0 * tau))] * tau)
    try:
        eps_advanced, _ = bun_steinke_composition(row.epsilon, delta / (2.0 * tau), tau, delta / 2.0)
    except ValueError:
        eps_advanced = math.inf
    return ClosedForm(name, min(eps_basic, eps_advanced))


def replacement_central(eps_central: float, delta: float) -> tuple[float, float]:
    """Replacement central DP from a removal bound: replacing x by x' changes two channels (bits x and x'),
    each change a removal-style change of one channel, composed basically: ``(2 eps_c, 2 delta)``."""
    return 2.0 * eps_central, 2.0 * delta


def replacement_tight(n: int, alpha: float, eps: float, delta: float) -> float:
    """Tight replacement central epsilon of a fragmented unary encoding (the ledger's ``eps_central``).

    Replacing value v by v' changes two channels: bit v goes 1 -> 0 and bit v' goes 0 -> 1. Channels are
    independent populations of binary-input randomizers (the per-channel pair of ``rappor_tight`` /
    ``fragments_tight``), so the two changes are a product of two copies of the symmetric §1.2 pair and the
    exact replacement curve is its two-fold composition, computed by PLDs (``odometer``). It is smaller
    than ``replacement_central``'s (2 eps_c, 2 delta) at the same delta. (The message cap's overflow, below
    2^-64 per client, is not included, as in the removal bounds.)

    Where the exact PLD is too large to build (``shuffle_pld.MAX_POINTS``) it returns basic composition of
    the two channels' tight bounds, 2 eps_c(delta/2), also valid.
    """
    from .shuffle_pld import PLDTooLargeError, shuffle_pld  # dp_accounting: imported only when accounting

    n, delta = check_int("n", n, 2), check_delta("delta", delta)
    try:
        channel = shuffle_pld(n, alpha, eps)  # at the exact n (not the odometer's grid): within 1e-3 of exact
    except PLDTooLargeError:
        return 2.0 * epsilon_central(n, alpha, eps, delta / 2.0)
    return float(channel.compose(channel).get_epsilon_for_delta(delta))
