"""``esa privacy`` reports of the fragmented unary encodings of [ESA]: attribute-fragmented k-RAPPOR (``rappor``)
and report fragmenting with a privacy backstop (``rappor_fragments``).

``eps_central`` is the ledger value and is **replacement** DP, like every other mechanism's and exactly what
the analyzer writes into estimates (the mechanism's ``epsilon_central``): the two channels a replacement
changes, composed tightly (``fragments.replacement_tight``). [ESA] accounts in the **removal** model; its values
are beside, labelled: ``eps_central_removal`` is [ESA] Lemma II.6 (Cheu et al.) on the bit channel that
protects the user's value (attribute channel for ``rappor``, backstop for ``rappor_fragments``), which
reproduces [ESA]'s tables (docs/mathematics.md §1.3), falling back to the tight bound where Lemma II.6's validity
window (lambda >= 14 ln(4/delta)) excludes the parameters; ``eps_central_removal_tight`` is the tight §1.2
removal bound (what ``epsilon_central_removal`` puts in the estimates' ``parameters``).
"""

from __future__ import annotations

from typing import Any

from ._checks import check_delta, check_epsilon, check_int
from .closed_forms import ClosedForm, lemma_ii6_rappor, theorem_iii1
from .composition import fragment_epsilon
from .fragments import (
    default_fragment_epsilon,
    fragment_alpha,
    fragment_rows_bound,
    fragments_tight,
    rappor_tight,
    replacement_central,
    replacement_tight,
    theorem_iv2,
)
from .mixture import alpha_binary_rr

__all__ = ["FRAGMENTED_PRIVACY_MECHANISMS", "format_fragmented_report", "fragmented_privacy_report"]

FRAGMENTED_PRIVACY_MECHANISMS: tuple[str, ...] = ("rappor", "rappor_fragments")


def _forms(*forms: ClosedForm) -> dict[str, dict[str, Any]]:
    return {form.name: {"epsilon": form.epsilon, "reason": form.reason} for form in forms}


def _ledger(lemma: ClosedForm, tight: float, channel: str) -> tuple[float, str]:
    """[ESA]'s removal value: Lemma II.6 where it applies, else the tight removal bound."""
    if lemma.epsilon is not None:
        return lemma.epsilon, (
            f"lemma_ii6: [ESA] Lemma II.6 on the {channel} channel, lambda = 2n/(1 + e^eps); removal central DP of "
            "the whole report (a removal changes one channel); the published accountant of [ESA]'s tables"
        )
    return tight, (f"tight: Lemma II.6 does not apply ({lemma.reason}); tight bound (docs/mathematics.md §1.2) "
                   f"of the {channel} channel")


_REPLACEMENT_RULE = ("replacement DP (the estimates' eps_central): the two changed {what} composed tightly by "
                     "privacy loss distributions, alpha {alpha:.6g}")


def _central(n: int, alpha: float, eps: float, delta: float, removal: float, what: str) -> dict[str, Any]:
    eps_rep, delta_rep = replacement_central(removal, delta)
    return {
        "neighbouring": "replacement",
        "eps_central": replacement_tight(n, alpha, eps, delta),
        "eps_central_rule": _REPLACEMENT_RULE.format(what=what, alpha=alpha),
        "eps_central_replacement_basic": {"epsilon": eps_rep, "delta": delta_rep},
    }


def _unary_messages(d: int, eps: float) -> float:
    """Expected ones of one-hot binary RR at removal budget eps: p + (d - 1) q."""
    q = alpha_binary_rr(eps)  # 1/(1 + e^eps)
    return (1.0 - q) + (d - 1) * q


def _rappor_report(domain: int, eps: float, n: int, delta: float) -> dict[str, Any]:
    lemma = lemma_ii6_rappor(n, eps, delta)
    tight = rappor_tight(n, eps, delta)
    eps_c, rule = _ledger(lemma, tight, "attribute")
    return {
        "mechanism": "rappor",
        "domain": domain,
        "epsilon_local": eps,
        "epsilon_local_replacement": 2.0 * eps,
        "n": n,
        "delta": delta,
        "alpha": alpha_binary_rr(eps),
        "alpha_rule": "per attribute channel (binary RR): 1/(e^eps + 1)",
        **_central(n, alpha_binary_rr(eps), eps, delta, eps_c, "attribute channels"),
        "eps_central_removal": eps_c,
        "eps_central_removal_rule": rule,
        "eps_central_removal_tight": tight,
        "expected_messages": _unary_messages(domain, eps),
        "closed_forms": _forms(lemma, theorem_iii1(n, eps, delta)),
    }


def _fragments_report(
    domain: int, eps_b: float, n: int, delta: float, tau: int, eps_f: float | None
) -> dict[str, Any]:
    if eps_f is None:
        eps_f, f_rule = default_fragment_epsilon(eps_b, tau), "default: sinh(eps_f/2) = sinh(eps_b/2)/sqrt(tau)"
    else:
        eps_f, f_rule = check_epsilon("epsilon_fragment", eps_f), "given"
    exposed = [fragment_epsilon(eps_b, eps_f, t) for t in range(1, tau + 1)]
    lemma = lemma_ii6_rappor(n, eps_b, delta)
    tight = fragments_tight(n, eps_b, eps_f, tau, delta)
    eps_c, rule = _ledger(lemma, tight, "backstop")
    alpha = fragment_alpha(eps_b, eps_f, tau)
    backstop = theorem_iii1(n, eps_b, delta)
    return {
        "mechanism": "rappor_fragments",
        "domain": domain,
        "fragments": tau,
        "epsilon_backstop": eps_b,
        "epsilon_fragment": eps_f,
        "epsilon_fragment_rule": f_rule,
        "epsilon_one_fragment": exposed[0],
        "epsilon_exposed": exposed,
        "epsilon_local": exposed[-1],
        "epsilon_local_replacement": 2.0 * exposed[-1],
        "n": n,
        "delta": delta,
        "alpha": alpha,
        "alpha_rule": "per bit, all tau fragments together (LDP eps(tau)): 1/(e^eps(tau) + 1)",
        **_central(n, alpha, exposed[-1], delta, eps_c, "bits' fragment tuples"),
        "eps_central_removal": eps_c,
        "eps_central_removal_rule": rule,
        "eps_central_removal_tight": tight,
        # each fragment bit is binary RR of the true bit at the composite budget eps(1) (symmetric flips)
        "expected_messages": tau * _unary_messages(domain, exposed[0]),
        "closed_forms": _forms(lemma, backstop, theorem_iv2(n, eps_b, eps_f, tau, delta),
                               fragment_rows_bound(n, eps_b, eps_f, tau, delta)),
    }


def fragmented_privacy_report(
    mechanism: str,
    domain: int,
    epsilon: float,
    n: int,
    delta: float,
    *,
    fragments: int | None = None,
    epsilon_fragment: float | None = None,
) -> dict[str, Any]:
    """Replacement (eps_c, delta) of n users (removal values beside) of ``rappor`` (epsilon = attribute
    budget) or ``rappor_fragments``
    (epsilon = backstop budget, ``fragments`` = tau, ``epsilon_fragment`` = eps_f or None for the §2.8 default).

    A JSON-serialisable dict; see the module docstring for which number is ``eps_central`` and why.
    """
    if mechanism not in FRAGMENTED_PRIVACY_MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(FRAGMENTED_PRIVACY_MECHANISMS)}; got {mechanism!r}")
    domain = check_int("domain", domain, 2)
    epsilon = check_epsilon("epsilon", epsilon)
    n = check_int("n", n, 2)
    delta = check_delta("delta", delta)
    if mechanism == "rappor":
        if fragments is not None or epsilon_fragment is not None:
            raise ValueError("fragments / epsilon_fragment apply to rappor_fragments only")
        return _rappor_report(domain, epsilon, n, delta)
    if fragments is None:
        raise ValueError("rappor_fragments needs fragments (tau, the number of fragments per bit)")
    return _fragments_report(domain, epsilon, n, delta, check_int("fragments", fragments, 1), epsilon_fragment)


def _value(form: dict[str, Any]) -> str:
    return f"{form['epsilon']:.6g}" if form["epsilon"] is not None else f"n/a: {form['reason']}"


def format_fragmented_report(report: dict[str, Any]) -> str:
    """Human-readable rendering of ``fragmented_privacy_report``'s dict."""
    lines = [f"mechanism        {report['mechanism']} (domain {report['domain']}; [ESA] budgets are removal DP)"]
    if report["mechanism"] == "rappor_fragments":
        exposed = report["epsilon_exposed"]
        lines += [
            f"fragments tau    {report['fragments']}",
            f"backstop eps_b   {report['epsilon_backstop']:g}",
            f"fragment eps_f   {report['epsilon_fragment']:.6g}  [{report['epsilon_fragment_rule']}]",
            f"local eps(1)     {report['epsilon_one_fragment']:.6g}  (adversary holding one fragment)",
        ]
        if len(exposed) > 2:
            middle = ", ".join(f"{e:.4g}" for e in exposed[1:-1][:8]) + (", ..." if len(exposed) > 10 else "")
            lines.append(f"local eps(t)     t=2..{len(exposed) - 1}: {middle}")
    lines += [
        f"local epsilon    {report['epsilon_local']:.6g} removal, {report['epsilon_local_replacement']:.6g} replacement"
        + ("  (all fragments: eps(tau))" if report["mechanism"] == "rappor_fragments" else ""),
        f"users n          {report['n']}",
        f"delta            {report['delta']:g}",
        f"messages/user    {report['expected_messages']:.6g} (expected)",
        f"central epsilon  {report['eps_central']:.6g}  [{report['eps_central_rule']}]",
        f"  basic (2 x removal) {report['eps_central_replacement_basic']['epsilon']:.6g} at delta "
        f"{report['eps_central_replacement_basic']['delta']:g}",
        f"removal epsilon  {report['eps_central_removal']:.6g}  [{report['eps_central_removal_rule']}]",
        f"  tight bound    {report['eps_central_removal_tight']:.6g}  (alpha {report['alpha']:.6g}: "
        f"{report['alpha_rule']})",
        "closed forms (comparison only):",
    ]
    width = max(len(name) for name in report["closed_forms"])
    lines += [f"  {name:<{width}}  {_value(form)}" for name, form in report["closed_forms"].items()]
    return "\n".join(lines)
