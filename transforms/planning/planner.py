"""The accounting planner behind ``esa plan``: from a central target (eps_c, delta) and n users to the local
parameters of a mechanism (docs/mathematics.md §1.2, §3, §4.1).

``plan_kv_mean`` returns the largest local epsilon whose TIGHT shuffle bound (§1.2: certified at the generic
alpha; the mechanism's alpha is validated and reported) meets the target, the output size t where the
mechanism has one, the expected squared errors from the closed-form variances, and [Collision]'s
closed-form plan (privacy blanket "given a central target", §1.3) beside it.
``plan_vector_mean`` ([VecSum], §4.1) lives in ``planner_vector`` and is re-exported here.

Choosing t (Collision, CoCo). A larger t lowers alpha = s/(s e^eps + t - s), which the clone pair at that alpha
would count as privacy; the certified bound does not (§1.2: that alpha leaves the victim a leftover law), so
eps_max no longer depends on t and t only trades variance at a fixed eps. Three rules:

* ``"joint"`` (default): minimise the mean estimator's variance over the pairs (eps, t) that meet the
  target: for each t the best eps is the largest feasible one eps_max(t) (the variance falls as eps grows),
  so minimise V(eps_max(t), t) over integer t by golden-section (V is unimodal in t in every case we looked
  at; a non-unimodal V would only cost optimality, never privacy). With the certified bound it finds the
  same optimum as "min-variance"; it is kept because it stays optimal for any accountant that depends on t.
* ``"min-variance"``: t(eps) minimises the variance at each candidate eps, then bisection on eps.
* ``"paper"``: [CoCo]'s rules (Collision ``floor(s e^eps + 2s - 1)``, CoCo mean rule ``ceil(e^eps s + s + 2)``).

Whatever the rule, the returned eps_local has been verified feasible (``plan_search``), and
``eps_central`` is recomputed with ``shuffle_bound.epsilon_central`` at the returned parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from transforms.planning.closed_forms import kv_closed_form
from transforms.planning.search import FeasibilityOracle, Search, largest_feasible_eps, minimise_int
from transforms.planning.vector import VectorMeanPlan, format_vector_plan, plan_vector_mean
from transforms.privacy._checks import check_delta, check_epsilon, check_int
from transforms.privacy.kv_formulas import (
    KVError,
    alpha_pckv_grr,
    alpha_pckv_ue,
    alpha_privkv,
    coco_best_t,
    coco_error,
    coco_t_mean_rule,
    collision_best_t,
    collision_error,
    collision_t_paper,
    pckv_allocation,
    pckv_error,
    privkv_error,
)
from transforms.privacy.mixture import alpha_collision, alpha_generic
from transforms.privacy.shuffle_bound import epsilon_central as tight_epsilon_central

__all__ = [
    "KV_MECHANISMS",
    "T_RULES",
    "KVMeanPlan",
    "VectorMeanPlan",
    "format_kv_plan",
    "format_vector_plan",
    "kv_alpha",
    "plan_kv_mean",
    "plan_vector_mean",
]

KV_MECHANISMS: tuple[str, ...] = ("collision", "coco", "pckv-ue", "pckv-grr", "privkv")
T_RULES: tuple[str, ...] = ("joint", "min-variance", "paper")
_WITH_T = ("collision", "coco")


@dataclass(frozen=True)
class KVMeanPlan:
    """A plan for a kv_mean metric. MSEs are expected sums of squared errors over the 2d items (frequency)
    and the d means, for n users, from the closed forms of ``kv_formulas``."""

    mechanism: str
    d: int
    s: int
    n: int
    delta: float
    eps_central_target: float
    eps_local: float
    t: int | None
    t_rule: str | None
    alpha: float
    alpha_rule: str
    eps_central: float
    mse_frequency: float
    mse_mean: float
    mse_note: str
    parameters: dict[str, float]
    closed_form: dict[str, Any]
    divergence_evaluations: int
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = "kv_mean"
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class _Model:
    alpha: Callable[[float, int | None], float]
    error: Callable[[float, int | None], KVError]
    alpha_rule: str
    mse_note: str
    parameters: Callable[[float], dict[str, float]]
    t_rules: dict[str, Callable[[float], int]] | None = None
    t_lower: int = 0
    t_step: int = 1


_EXACT = "exact closed-form variances (§3), fully random hashing"


def _model(mechanism: str, d: int, s: int, n: int) -> _Model:
    if mechanism == "collision":
        return _Model(
            # below t = 2s the value s/Omega breaks (1 + e^eps) alpha <= 1: fall back to the generic alpha
            alpha=lambda eps, t: min(alpha_collision(eps, s, t), alpha_generic(eps)),
            error=lambda eps, t: collision_error(d, s, eps, t),
            alpha_rule="s/Omega, Omega = s e^eps + t - s (docs/mathematics.md §1.2)",
            mse_note=_EXACT, parameters=lambda eps: {},
            t_rules={"min-variance": lambda eps: collision_best_t(d, s, eps),
                     "paper": lambda eps: collision_t_paper(eps, s)},
            t_lower=s + 1,
        )
    if mechanism == "coco":
        return _Model(
            alpha=lambda eps, t: alpha_collision(eps, s, t),
            error=lambda eps, t: coco_error(d, s, eps, t),
            alpha_rule="s/Omega, Omega = s e^eps + t - s (as Collision, §3.2)",
            mse_note="[CoCo] Lemma 3 (expectation over hashing); items = (non-missing +- mean)/2",
            parameters=lambda eps: {},
            t_rules={"min-variance": lambda eps: coco_best_t(d, s, eps),
                     "paper": lambda eps: coco_t_mean_rule(eps, s)},
            t_lower=2 * s + 2, t_step=2,
        )
    if mechanism in ("pckv-ue", "pckv-grr"):
        variant = mechanism.split("-")[1]
        rule = ("max TV/(e^eps - 1) = 1/(2(e^eps + 1)), as OUE" if variant == "ue" else
                f"k-RR over 2d' = {2 * (d + s)} outputs: 1/(e^eps + 2d' - 1)")
        alpha = (lambda eps, t: alpha_pckv_ue(eps)) if variant == "ue" else (lambda eps, t: alpha_pckv_grr(eps, d, s))
        return _Model(
            alpha=alpha, error=lambda eps, t: pckv_error(variant, d, s, eps), alpha_rule=rule,
            mse_note="exact closed form (§3.4, ell = s, unbiased linear inversion)",
            parameters=lambda eps: dict(zip(("eps1", "eps2"), pckv_allocation(eps), strict=True)),
        )
    if mechanism == "privkv":
        return _Model(
            alpha=lambda eps, t: alpha_privkv(eps), error=lambda eps, t: privkv_error(d, s, eps, n),
            alpha_rule="generic 1/(e^eps + 1), eps = eps_k + eps_v (§8.6)",
            mse_note="§3.3 unbiased estimator; N_j ~ n/d; sampling term at its worst case (uniform data)",
            parameters=lambda eps: {"eps_k": eps / 2.0, "eps_v": eps / 2.0},
        )
    raise ValueError(f"mechanism must be one of {', '.join(KV_MECHANISMS)}; got {mechanism!r}")


def kv_alpha(mechanism: str, d: int, s: int, eps: float, t: int | None = None) -> float:
    """The mixture alpha the planner uses for ``mechanism`` at local budget eps (and output size t)."""
    return _model(mechanism, d, s, 2).alpha(eps, t)


def _joint(model: _Model, oracle: FeasibilityOracle, target: float) -> int:
    """The t minimising the mean variance at eps_max(t) (module docstring). eps_max grows with t (alpha falls
    with t), so the searches already done bracket the next one; the final search is redone from scratch."""
    done: dict[int, Search] = {}
    values: dict[int, float] = {}

    def g(h: int) -> float:
        if h not in values:
            t = model.t_lower + model.t_step * h
            below = [done[k].eps for k in done if k < h]
            above = [done[k].infeasible for k in done if k > h and done[k].infeasible is not None]
            search = largest_feasible_eps(
                lambda eps: oracle(model.alpha(eps, t), eps), target, lo=max(below, default=None),
                hi=min(above, default=None), rel_tol=1e-6, grid_checks=0)
            done[h] = search
            values[h] = model.error(search.eps, t).mean
        return values[h]

    return model.t_lower + model.t_step * minimise_int(g, 0)


def plan_kv_mean(
    mechanism: str,
    d: int,
    s: int,
    n: int,
    epsilon_central: float,
    delta: float,
    *,
    t: int | None = None,
    t_rule: str = "joint",
) -> KVMeanPlan:
    """Largest local epsilon (and t) of ``mechanism`` whose tight shuffle bound over n users meets
    (epsilon_central, delta); ``t`` fixes the output size (Collision/CoCo) instead of choosing it by ``t_rule``.
    """
    if mechanism not in KV_MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(KV_MECHANISMS)}; got {mechanism!r}")
    d, s, n = check_int("d", d, 1), check_int("s", s, 1), check_int("n", n, 2)
    if s > d:
        raise ValueError(f"s (non-zero keys per user) must be <= d, got s={s}, d={d}")
    target = check_epsilon("epsilon_central", epsilon_central)
    delta = check_delta("delta", delta)
    if t_rule not in T_RULES:
        raise ValueError(f"t_rule must be one of {', '.join(T_RULES)}; got {t_rule!r}")
    model = _model(mechanism, d, s, n)
    if model.t_rules is None:
        if t is not None:
            raise ValueError(f"{mechanism} has no output size t; drop t (only collision and coco take one)")
        rule_used = None
    elif t is not None:
        t = check_int("t", t, model.t_lower)
        if t % model.t_step:
            raise ValueError(f"CoCo needs an even t >= {model.t_lower}, got t={t}")
        rule_used = "fixed"
    else:
        rule_used = t_rule
    oracle = FeasibilityOracle(n, target, delta)
    if rule_used == "joint":
        t = _joint(model, oracle, target)
    if model.t_rules is not None and rule_used in model.t_rules:
        rule = model.t_rules[rule_used]
        search = largest_feasible_eps(lambda eps: oracle(model.alpha(eps, rule(eps)), eps), target)
        t = rule(search.eps)
    else:
        search = largest_feasible_eps(lambda eps: oracle(model.alpha(eps, t), eps), target)
    eps = search.eps
    alpha = model.alpha(eps, t)
    notes = []
    if search.capped:
        notes.append(f"local epsilon capped at {eps:g}: the target is met by every budget up to the cap")
    if not search.monotone:
        notes.append("feasibility was not monotone in eps_local on the check grid; the search restarted below")
    return KVMeanPlan(
        mechanism=mechanism, d=d, s=s, n=n, delta=delta, eps_central_target=target, eps_local=eps, t=t,
        t_rule=rule_used, alpha=alpha, alpha_rule=model.alpha_rule,
        eps_central=tight_epsilon_central(n, alpha, eps, delta),
        mse_frequency=model.error(eps, t).frequency / n, mse_mean=model.error(eps, t).mean / n,
        mse_note=model.mse_note, parameters=model.parameters(eps),
        closed_form=kv_closed_form(mechanism, d, s, n, target, delta),
        divergence_evaluations=oracle.evaluations, notes=tuple(notes),
    )


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def format_kv_plan(plan: KVMeanPlan) -> str:
    """Human-readable rendering of a ``KVMeanPlan``."""
    lines = [
        f"plan             kv_mean with {plan.mechanism} (d={plan.d} keys, s={plan.s} per user, n={plan.n})",
        f"central target   eps_c={plan.eps_central_target:g}, delta={plan.delta:g} (replacement DP)",
        f"local epsilon    {plan.eps_local:.6g}",
    ]
    if plan.t is not None:
        lines.append(f"output size t    {plan.t}  [{plan.t_rule}]")
    lines += [f"{name:<17}{_number(value)}" for name, value in plan.parameters.items()]
    lines += [
        f"mixture alpha    {plan.alpha:.6g}  [{plan.alpha_rule}]",
        f"central epsilon  {plan.eps_central:.6g}  (tight bound, docs/mathematics.md §1.2, at these parameters)",
        f"expected MSE     frequencies {plan.mse_frequency:.6g} (sum over 2d items), "
        f"means {plan.mse_mean:.6g} (sum over d keys)  [{plan.mse_note}]",
    ]
    form = plan.closed_form
    if form["valid"]:
        shown = ", ".join(f"{key} {_number(form[key])}" for key in
                          ("omega", "t", "eps_local", "mse_frequency", "mse_mean", "tight_eps_central")
                          if form.get(key) is not None)
        lines.append(f"closed form      {form['name']}: {shown}")
    else:
        lines.append(f"closed form      {form['name']}: n/a: {form['reason']}")
    lines += [f"note             {note}" for note in plan.notes]
    return "\n".join(lines)
