"""The vector_mean plan ([VecSum], docs/mathematics.md §4.1): blanket probability gamma and precision k_round from a
central target, refused with what to raise when [VecSum]'s rule is infeasible (gamma >= 1).

Two accountants:

* ``"002"`` (default): [VecSum]'s rules (§4.5 for t = 1, Thm 4.1 with advanced composition for t > 1). For t = 1
  the tight bound of the resulting gamma is reported too, which shows how conservative the rule is.
* ``"tight"``: the largest per-report budget eps0 whose tight bound (§1.2) meets the target, i.e. the smallest
  gamma; with no k_round given, k is chosen to minimise the per-report variance bound at each k's own smallest
  gamma. For t = 1 the alpha is k-RR's 1/(e^eps0 + k) (``vector_formulas.alpha_vector``). For t > 1 a user's
  t messages are treated as one report of budget t eps0 with the generic alpha 1/(e^(t eps0) + 1): shuffling
  the messages one by one is a post-processing of shuffling whole tuples (the message multiset is a function
  of the tuple multiset), so the single-report bound holds, loosely.

Whatever the accountant, ``eps_central`` is the tight bound of the final parameters with that alpha.

MSEs are on the [0, 1] scale of §4.1 (multiply by 4 for data mapped from [-1, 1]), for the Horvitz-Thompson
mean estimator (d/(t n)) DeBias(z_l), summed over the d coordinates: ``mse_mean_noise`` = d^2/(t n) x the
per-report bound ([VecSum]'s "normalized MSE"), ``mse_mean_sampling`` = d(d - t)/(t n), the worst case (x^2 <= 1)
of the coordinate-sampling term [VecSum] leaves out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from transforms.planning.search import FeasibilityOracle, largest_feasible_eps
from transforms.privacy._checks import check_delta, check_epsilon, check_int
from transforms.privacy.mixture import alpha_generic
from transforms.privacy.shuffle_bound import epsilon_central as tight_epsilon_central
from transforms.privacy.vector_formulas import (
    alpha_vector,
    eps0_from_gamma,
    gamma_002,
    gamma_from_eps0,
    k_round_002,
    normalized_mse_bound_002,
    report_variance_bound,
)

__all__ = ["ACCOUNTANTS", "VectorMeanPlan", "format_vector_plan", "plan_vector_mean"]

ACCOUNTANTS: tuple[str, ...] = ("002", "tight")
K_SEARCH_LIMIT = 1024


@dataclass(frozen=True)
class VectorMeanPlan:
    """A plan for a vector_mean metric (fields as in the module docstring; eps_local_user = t * eps0)."""

    d: int
    n: int
    delta: float
    eps_central_target: float
    t: int
    accountant: str
    k_round: int
    k_rule: str
    gamma: float
    eps_local_message: float
    eps_local_user: float
    alpha: float
    eps_central: float
    mse_mean_noise: float
    mse_mean_sampling: float
    mse_mean: float
    closed_form: dict[str, Any]
    divergence_evaluations: int
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = "vector_mean"
        out["notes"] = list(self.notes)
        return out


def _rule_002(d: int, n: int, eps_c: float, delta: float, t: int, k_round: int | None) -> dict[str, Any]:
    """[VecSum]'s plan as a dict; ``valid`` False with a ``reason`` saying what to raise when it is infeasible."""
    name = "[VecSum] §4.5 (t = 1)" if t == 1 else "[VecSum] Thm 4.1 (advanced composition)"
    out: dict[str, Any] = {"name": name, "valid": False, "reason": None, "k_star": None, "k_round": k_round,
                           "gamma": None, "normalized_mse_bound": None}
    try:
        k_star = k_round_002(d, n, eps_c, delta, t)
    except ValueError as err:
        out["reason"] = str(err)
        return out
    k = k_round if k_round is not None else max(1, round(k_star))
    gamma = gamma_002(d, k, n, eps_c, delta, t)
    out.update(k_star=k_star, k_round=k, gamma=gamma)
    if gamma >= 1.0:
        needed = math.floor(1 + (n - 1) * gamma) + 1  # gamma is proportional to 1/(n - 1)
        out["reason"] = (f"[VecSum]'s rule needs gamma = {gamma:.6g} >= 1 (d={d}, k_round={k}, n={n}, eps_c={eps_c:g}, "
                         f"delta={delta:g}): raise n to at least {needed}, or raise epsilon_central, or lower "
                         f"{'k_round or d' if k > 1 else 'd'}; or use the tight accountant")
        return out
    out.update(valid=True, normalized_mse_bound=normalized_mse_bound_002(d, n, eps_c, delta, gamma, t))
    return out


def _alpha(eps0: float, k: int, t: int) -> float:
    """Mixture alpha of one user's t reports (module docstring), with local budget t * eps0."""
    return alpha_vector(eps0, k) if t == 1 else alpha_generic(t * eps0)


def _tight_eps0(oracle: FeasibilityOracle, target: float, k: int, t: int, grid_checks: int) -> float:
    """Largest eps0 whose user-level budget t * eps0 meets the target with ``_alpha``."""
    search = largest_feasible_eps(lambda eps_user: oracle(_alpha(eps_user / t, k, t), eps_user), target,
                                  grid_checks=grid_checks)
    return search.eps / t


def plan_vector_mean(
    d: int,
    n: int,
    epsilon_central: float,
    delta: float,
    k_round: int | None = None,
    t: int = 1,
    *,
    accountant: str = "002",
) -> VectorMeanPlan:
    """Parameters of [VecSum]'s vector summation meeting (epsilon_central, delta) for n users (module docstring)."""
    d, n = check_int("d", d, 1), check_int("n", n, 2)
    t = check_int("t", t, 1)
    if t > d:
        raise ValueError(f"t (coordinates per user) must be <= d, got t={t}, d={d}")
    target = check_epsilon("epsilon_central", epsilon_central)
    delta = check_delta("delta", delta)
    if k_round is not None:
        k_round = check_int("k_round", k_round, 1)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}; got {accountant!r}")
    rule = _rule_002(d, n, target, delta, t, k_round)
    oracle = FeasibilityOracle(n, target, delta)
    notes: list[str] = []
    if accountant == "002":
        if not rule["valid"]:
            raise ValueError(rule["reason"])
        k, gamma = rule["k_round"], rule["gamma"]
        k_rule = "given" if k_round is not None else f"[VecSum] rule, k* = {rule['k_star']:.4g} rounded"
        eps0 = eps0_from_gamma(gamma, k)
    else:
        if k_round is not None:
            k, k_rule = k_round, "given"
        else:  # the bound falls then rises in k: scan until it has risen twice in a row
            bounds: list[float] = []
            while len(bounds) < K_SEARCH_LIMIT and not (len(bounds) >= 3 and bounds[-1] >= bounds[-2] >= bounds[-3]):
                k = len(bounds) + 1
                bounds.append(report_variance_bound(k, gamma_from_eps0(_tight_eps0(oracle, target, k, t, 0), k)))
            k, k_rule = 1 + bounds.index(min(bounds)), "minimises the per-report bound under the tight bound"
        eps0 = _tight_eps0(oracle, target, k, t, 8)
        gamma = gamma_from_eps0(eps0, k)
        if t * eps0 >= 30.0:
            notes.append("user-level epsilon capped at 30")
    alpha = _alpha(eps0, k, t)
    achieved = tight_epsilon_central(n, alpha, t * eps0, delta)
    if t > 1:
        notes.append("t > 1: tight bound with the generic alpha of a user's t reports (budget t eps0), loose")
    noise = d * d / (t * n) * report_variance_bound(k, gamma)
    sampling = d * (d - t) / (t * n)
    return VectorMeanPlan(
        d=d, n=n, delta=delta, eps_central_target=target, t=t, accountant=accountant, k_round=k, k_rule=k_rule,
        gamma=gamma, eps_local_message=eps0, eps_local_user=t * eps0, alpha=alpha, eps_central=achieved,
        mse_mean_noise=noise, mse_mean_sampling=sampling, mse_mean=noise + sampling, closed_form=rule,
        divergence_evaluations=oracle.evaluations, notes=tuple(notes),
    )


def format_vector_plan(plan: VectorMeanPlan) -> str:
    """Human-readable rendering of a ``VectorMeanPlan``."""
    lines = [
        f"plan             vector_mean ([VecSum]), d={plan.d} coordinates, t={plan.t} per user, n={plan.n}",
        f"central target   eps_c={plan.eps_central_target:g}, delta={plan.delta:g} (replacement DP)",
        f"accountant       {plan.accountant}",
        f"k_round          {plan.k_round}  [{plan.k_rule}]",
        f"gamma            {plan.gamma:.6g}  (blanket probability)",
        f"local epsilon    {plan.eps_local_message:.6g} per report, {plan.eps_local_user:.6g} per user",
    ]
    rule = "k-RR over k+1 values: gamma/(k+1)" if plan.t == 1 else "generic 1/(e^(t eps0) + 1) for t reports"
    lines += [
        f"mixture alpha    {plan.alpha:.6g}  [{rule}]",
        f"central epsilon  {plan.eps_central:.6g}  (tight bound, docs/mathematics.md §1.2, at this gamma)",
        f"expected MSE     {plan.mse_mean:.6g} = noise {plan.mse_mean_noise:.6g} + coordinate sampling "
        f"<= {plan.mse_mean_sampling:.6g}  (sum over d means, [0, 1] scale)",
    ]
    rule = plan.closed_form
    if rule["valid"]:
        lines.append(f"closed form      {rule['name']}: k*={rule['k_star']:.4g}, k_round={rule['k_round']}, "
                     f"gamma={rule['gamma']:.6g}, normalized MSE bound {rule['normalized_mse_bound']:.6g}")
    else:
        lines.append(f"closed form      {rule['name']}: n/a: {rule['reason']}")
    lines += [f"note             {note}" for note in plan.notes]
    return "\n".join(lines)
