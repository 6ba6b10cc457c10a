"""The privacy report behind ``esa privacy``: tight central epsilon of a shuffled frequency oracle, next to
the closed forms that do (or, with the reason, do not) apply to it.

The report is a plain JSON-serialisable dict (str, int, float, None) so the CLI can print it as JSON or as
text (``format_privacy_report``) without a second code path.

``privacy_report`` covers the single-message oracles (replacement DP, tight bound as ``eps_central``); the
multi-message fragmented encodings of [ESA] (removal DP, Lemma II.6 as ``eps_central``) have their own report in
``fragment_report``. ``build_privacy_report`` dispatches between the two (it is what ``esa privacy`` calls)
and ``format_privacy_report`` renders either.
"""

from __future__ import annotations

from typing import Any

from ._checks import check_delta, check_epsilon, check_int
from .blanket_shuffle import (
    BOUND_BLANKET,
    BOUND_GENERIC,
    BlanketDecomposition,
    blanket_grr,
    blanket_oue,
)
from .closed_forms import (
    ClosedForm,
    blanket_krr,
    efmrtt19,
    fmt21_clones,
    lemma_ii5,
)
from .events import NeighbouringRelation, WindowEvent, central_epsilon
from .fragment_report import FRAGMENTED_PRIVACY_MECHANISMS, format_fragmented_report, fragmented_privacy_report
from .mixture import alpha_generic, alpha_grr, alpha_olh, alpha_oue, olh_buckets
from .shuffle_bound import certified_alpha

PRIVACY_MECHANISMS: tuple[str, ...] = ("grr", "oue", "olh", "generic")  # single-message: ``privacy_report``
ALL_PRIVACY_MECHANISMS: tuple[str, ...] = PRIVACY_MECHANISMS + FRAGMENTED_PRIVACY_MECHANISMS

_KRR_ONLY = "applies to k-ary randomized response only"
_BINARY_RR_ONLY = "applies to binary randomized response (attribute-fragmented k-RAPPOR channels) only"


def mechanism_alpha(mechanism: str, domain: int, eps: float) -> tuple[float, str]:
    """Mixture alpha of a frequency oracle for the tight bound, with the rule used (for the report)."""
    if mechanism == "grr":
        return alpha_grr(eps, domain), f"k-RR over d={domain} values: 1/(e^eps + d - 1)"
    if mechanism == "oue":
        return alpha_oue(eps), "OUE (p=1/2, q=1/(1+e^eps)): TV/(e^eps - 1) = 1/(2(e^eps + 1))"
    if mechanism == "olh":
        g = olh_buckets(eps)
        return alpha_olh(eps, g), f"OLH with g={g} buckets (max(2, round(e^eps + 1))): 1/(e^eps + g - 1)"
    if mechanism == "generic":
        return alpha_generic(eps), "any eps-LDP randomizer: 1/(e^eps + 1)"
    raise ValueError(f"mechanism must be one of {', '.join(PRIVACY_MECHANISMS)}; got {mechanism!r}")


def _closed_forms(mechanism: str, domain: int, eps: float, n: int, delta: float) -> list[ClosedForm]:
    if mechanism == "grr":
        blanket = blanket_krr(n, eps, domain, delta)
    elif mechanism == "olh":  # given its public seed, an OLH report is k-RR over g buckets
        blanket = blanket_krr(n, eps, olh_buckets(eps), delta)
    else:
        blanket = ClosedForm("blanket_krr", None, _KRR_ONLY)
    return [
        efmrtt19(n, eps, delta),
        blanket,
        ClosedForm("lemma_ii6", None, _BINARY_RR_ONLY),
        ClosedForm("theorem_iii1", None, _BINARY_RR_ONLY),
        fmt21_clones(n, eps, delta),
        lemma_ii5(n, eps, delta),
    ]


def privacy_report(mechanism: str, domain: int, epsilon: float, n: int, delta: float,
                   decomposition: BlanketDecomposition | None = None) -> dict[str, Any]:
    """Central (eps_c, delta) of n shuffled reports of ``mechanism`` (replacement DP on both sides).

    ``eps_central`` is ``events.central_epsilon`` of the window's event (the function the analyzer's rows call):
    the smaller of the generic clone pair of ``shuffle_bound`` (evaluated at ``alpha_certified``; the
    mechanism's ``alpha`` is reported for reference) and the blanket pair of ``blanket_shuffle`` (its pair
    classes included) where the mechanism has a blanket ``decomposition`` (its ``blanket_decomposition()``;
    None: the formula of k-RR or OUE, which need nothing but (d, eps); OLH's needs its hash family, so the
    caller passes it); ``eps_central_bound`` names the bound used. ``closed_forms`` maps each closed form to
    ``{"epsilon": float | None, "reason": str | None}`` for comparison.
    """
    if mechanism not in PRIVACY_MECHANISMS:
        multi = mechanism in FRAGMENTED_PRIVACY_MECHANISMS
        hint = " (a multi-message mechanism: use build_privacy_report)" if multi else ""
        raise ValueError(f"mechanism must be one of {', '.join(PRIVACY_MECHANISMS)}; got {mechanism!r}{hint}")
    domain = check_int("domain", domain, 2)
    epsilon = check_epsilon("epsilon", epsilon)
    n = check_int("n", n, 2)
    delta = check_delta("delta", delta)
    alpha, rule = mechanism_alpha(mechanism, domain, epsilon)
    if decomposition is None and mechanism in ("grr", "oue"):
        decomposition = blanket_grr(epsilon, domain) if mechanism == "grr" else blanket_oue(epsilon)
    result = central_epsilon(WindowEvent(mechanism, NeighbouringRelation.REPLACEMENT, n, delta, epsilon, alpha,
                                         decomposition))
    best, bound = result.epsilon, result.bound
    generic, blanket = result.candidate(BOUND_GENERIC), result.candidate(BOUND_BLANKET)
    return {
        "mechanism": mechanism,
        "domain": domain,
        "epsilon_local": epsilon,
        "n": n,
        "delta": delta,
        "alpha": alpha,
        "alpha_rule": rule,
        "alpha_certified": certified_alpha(alpha, epsilon),
        "eps_central": best,
        "eps_central_bound": bound,
        "eps_central_notion": NeighbouringRelation.REPLACEMENT.value,
        "eps_central_generic": generic,
        "eps_central_blanket": blanket,
        "blanket": None if decomposition is None else {"decomposition": list(decomposition.as_tuple()),
                                                       "rule": decomposition.rule},
        "closed_forms": {
            form.name: {"epsilon": form.epsilon, "reason": form.reason}
            for form in _closed_forms(mechanism, domain, epsilon, n, delta)
        },
    }


def build_privacy_report(
    mechanism: str,
    domain: int,
    epsilon: float,
    n: int,
    delta: float,
    *,
    fragments: int | None = None,
    epsilon_fragment: float | None = None,
    decomposition: BlanketDecomposition | None = None,
) -> dict[str, Any]:
    """The report of any mechanism of ``ALL_PRIVACY_MECHANISMS`` (``fragments``/``epsilon_fragment``: report
    fragmenting only; passing them for another mechanism is an error, not silently ignored)."""
    if mechanism in FRAGMENTED_PRIVACY_MECHANISMS:
        return fragmented_privacy_report(mechanism, domain, epsilon, n, delta, fragments=fragments,
                                         epsilon_fragment=epsilon_fragment)
    if mechanism not in PRIVACY_MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(ALL_PRIVACY_MECHANISMS)}; got {mechanism!r}")
    if fragments is not None or epsilon_fragment is not None:
        raise ValueError("fragments / epsilon_fragment apply to rappor_fragments only")
    return privacy_report(mechanism, domain, epsilon, n, delta, decomposition)


def format_privacy_report(report: dict[str, Any]) -> str:
    """Human-readable rendering of ``privacy_report``'s (or ``fragmented_privacy_report``'s) dict."""
    if report["mechanism"] in FRAGMENTED_PRIVACY_MECHANISMS:
        return format_fragmented_report(report)
    lines = [
        f"mechanism        {report['mechanism']} (domain {report['domain']})",
        f"local epsilon    {report['epsilon_local']:g} (replacement LDP)",
        f"users n          {report['n']}",
        f"delta            {report['delta']:g}",
        f"mixture alpha    {report['alpha']:.6g}  [{report['alpha_rule']}]",
        f"certified at     {report['alpha_certified']:.6g}  [generic 1/(e^eps + 1): the clone pair dominates only "
        "without a victim leftover law]",
        f"central epsilon  {report['eps_central']:.6g}  ({report['eps_central_bound']}: the smallest valid bound, "
        "docs/mathematics.md §1.2)",
        f"  generic pair   {report['eps_central_generic']:.6g}",
        "  blanket pair   " + (f"{report['eps_central_blanket']:.6g}  [{report['blanket']['rule']}]"
                              if report["blanket"] is not None else "n/a: no blanket decomposition declared"),
        "closed forms (comparison only):",
    ]
    width = max(len(name) for name in report["closed_forms"])
    for name, form in report["closed_forms"].items():
        value = f"{form['epsilon']:.6g}" if form["epsilon"] is not None else f"n/a: {form['reason']}"
        lines.append(f"  {name:<{width}}  {value}")
    return "\n".join(lines)
