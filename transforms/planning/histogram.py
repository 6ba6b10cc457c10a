"""``esa plan --kind histogram``: which frequency oracle, at which local epsilon, for d categories and n clients.

Two questions, answered for every single-report oracle (``grr``, ``oue``, ``olh``, ``hadamard``, ``cms``) and
the attribute-fragmented ``rappor`` of *Encode, Shuffle, Analyze* (Erlingsson et al., 2020):

* **central target** (``epsilon_central``): the largest local epsilon whose central epsilon over n shuffled
  clients meets (eps_c, delta), by the verified bisection of ``plan_search``. The central epsilon is the
  one the analyzer's ledger reports and ``esa privacy`` prints (``transforms.privacy.events.central_epsilon``):
  the smallest valid shuffle bound (the blanket pair where the randomizer declares a decomposition, else the
  generic clone pair at its ``mixture_alpha``), or the mechanism's own accountant (RAPPOR: two channels
  change under replacement).
* **target stderr** (``target_stderr``): the smallest local epsilon whose per-item standard error meets the
  target, and the central epsilon that costs.

The per-item standard error is the mechanism's own ``variance(counts, n)`` (the closed form the analyzer
reports), evaluated at a uniform population (every item at frequency 1/d) and given as a fraction of n.
The mechanism with the smallest stderr (central target) or the smallest central epsilon (stderr target)
is recommended; ties and near-ties are visible in ``options``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from transforms.mechanisms.registry import build_mechanism
from transforms.planning.search import EPS_LOCAL_CAP, FeasibilityOracle, largest_feasible_eps
from transforms.privacy._checks import check_delta, check_epsilon, check_int
from transforms.privacy.events import NeighbouringRelation, central_epsilon, window_event
from transforms.privacy.mixture import alpha_binary_rr, olh_buckets
from transforms.privacy.odometer import WindowRelease
from transforms.privacy.shuffle_bound import epsilon_central as tight_epsilon_central

__all__ = ["HISTOGRAM_MECHANISMS", "HistogramOption", "HistogramPlan", "HistogramWindowsPlan",
           "format_histogram_plan", "format_histogram_windows_plan", "histogram_mechanism", "plan_histogram",
           "plan_histogram_windows"]

HISTOGRAM_MECHANISMS: tuple[str, ...] = ("grr", "oue", "olh", "hadamard", "cms", "rappor")
MIN_OLH_SEED_FAMILY = 1024
REL_TOL = 1e-7
RAPPOR_REL_TOL = 2e-3  # RAPPOR's exact search: within 0.2 % of the largest feasible budget
RAPPOR_CAP = 20.0  # AttributeFragmentedRappor refuses larger budgets (53-bit uniforms)


def histogram_mechanism(name: str, d: int, eps: float) -> Any:
    """The oracle as the pipeline builds it from a spec with ``[domain] d`` (defaults), except OLH's seed family,
    raised to the ``S g >= 4 d`` its decoder needs when d is large."""
    params: dict[str, Any] = {}
    if name == "olh":

        params["seed_family"] = min(max(MIN_OLH_SEED_FAMILY, -(-4 * d // olh_buckets(eps))), 2**32)
    return build_mechanism(name, "histogram", {"d": d}, eps, params)


def _central(mech: Any, n: int, delta: float) -> float:
    """The analyzer's ledger value for one report per client: ``events.central_epsilon`` of the window's event,
    the one computation behind the rows and ``esa privacy`` (the mechanism's own accountant, else the smallest
    valid shuffle bound: the blanket pair where the randomizer declares a decomposition)."""
    return central_epsilon(window_event(mech, n, delta)).epsilon


def _stderr(mech: Any, n: int, d: int) -> float:
    counts = np.full(d, n / d, dtype=np.float64)
    return float(math.sqrt(float(np.asarray(mech.variance(counts, n))[0]))) / n


@dataclass(frozen=True)
class HistogramOption:
    """One oracle's plan. ``eps_local`` is the mechanism's ``epsilon`` parameter (RAPPOR: the removal budget,
    replacement 2 eps); ``stderr`` is per item, a fraction of n, at a uniform population."""
    mechanism: str
    eps_local: float
    eps_central: float
    alpha: float
    stderr: float
    message_bits: int
    messages_per_client: float
    parameters: dict[str, Any]
    feasible: bool
    note: str = ""
    blanket: tuple[float, float, float, float, float] | None = None  # the randomizer's blanket decomposition

    def window_release(self, n: int, delta_window: float) -> WindowRelease:
        """This plan's window for the composition over windows (``plan_windows``): the shuffle PLD for a single
        report (the blanket pair's where the randomizer declares one, as the analyzer's odometer composes it),
        the per-window (eps_c, delta) guarantee for RAPPOR's two channels."""
        if self.mechanism == "rappor":
            return WindowRelease.approximate(self.eps_central, delta_window, n)
        return WindowRelease(self.alpha, self.eps_local, n, blanket=self.blanket)


@dataclass(frozen=True)
class HistogramPlan:
    """Every oracle's plan for d categories and n clients, and the recommended one."""
    d: int
    n: int
    delta: float
    eps_central_target: float | None
    target_stderr: float | None
    options: tuple[HistogramOption, ...]
    recommended: str | None
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> HistogramOption:
        if self.recommended is None:
            raise ValueError("no oracle meets the target: " + "; ".join(o.note for o in self.options))
        return next(o for o in self.options if o.mechanism == self.recommended)

    @property
    def alpha(self) -> float:
        return self.best.alpha

    @property
    def eps_local(self) -> float:
        return self.best.eps_local

    @property
    def eps_central(self) -> float:
        return self.best.eps_central

    def window_release(self, n: int, delta_window: float) -> WindowRelease:
        return self.best.window_release(n, delta_window)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = "histogram"
        out["notion"] = NeighbouringRelation.REPLACEMENT.value  # every eps_central of the plan
        out["options"] = [asdict(o) for o in self.options]
        out["notes"] = list(self.notes)
        return out


def _option(name: str, d: int, n: int, delta: float, eps: float, feasible: bool, note: str = "") -> HistogramOption:
    mech = histogram_mechanism(name, d, eps)
    dec = None if mech.accounts_central else mech.blanket_decomposition()
    return HistogramOption(
        mechanism=name, eps_local=eps, eps_central=_central(mech, n, delta), alpha=float(mech.mixture_alpha),
        stderr=_stderr(mech, n, d), message_bits=int(mech.message_bits),
        messages_per_client=float(mech.expected_messages or 1.0), parameters=dict(mech.parameters()),
        feasible=feasible, note=note, blanket=None if dec is None else dec.as_tuple())


def _rappor_eps(d: int, n: int, target: float, delta: float) -> float:
    """RAPPOR's largest local epsilon for the target. Its ledger composes two channels by PLDs (about a second
    per evaluation), so the exact search runs only inside a bracket found by cheap bounds: basic composition
    2 eps_c(delta/2) of the channels is feasible wherever it meets the target (lower end), one channel's
    tight bound is below the ledger's (upper end)."""
    def capped(test: Any) -> Any:
        return lambda eps: eps <= RAPPOR_CAP and test(eps)

    basic = largest_feasible_eps(capped(lambda eps: 2.0 * tight_epsilon_central(
        n, alpha_binary_rr(eps), eps, delta / 2.0) <= target), target, lo=target / 2.0, rel_tol=1e-5, grid_checks=0)
    single = FeasibilityOracle(n, target, delta)
    upper = largest_feasible_eps(capped(lambda eps: single(alpha_binary_rr(eps), eps)), target, rel_tol=1e-5,
                                 grid_checks=0)
    if upper.infeasible is None or upper.infeasible <= basic.eps:
        return basic.eps
    exact = largest_feasible_eps(capped(lambda eps: _central(histogram_mechanism("rappor", d, eps), n, delta)
                                        <= target), target, lo=basic.eps, hi=upper.infeasible,
                                 rel_tol=RAPPOR_REL_TOL, grid_checks=0)
    return exact.eps


def _for_central(name: str, d: int, n: int, target: float, delta: float) -> HistogramOption:
    note = ""
    if name == "rappor":
        eps = _rappor_eps(d, n, target, delta)
    else:
        oracle = FeasibilityOracle(n, target, delta)
        def feasible(eps: float) -> bool:
            mech = histogram_mechanism(name, d, eps)
            return oracle(mech.mixture_alpha, eps, mech.blanket_decomposition())

        search = largest_feasible_eps(feasible, target, rel_tol=REL_TOL)
        eps = search.eps
        note = f"local epsilon capped at {EPS_LOCAL_CAP:g}" if search.capped else ""
    return _option(name, d, n, delta, eps, True, note)


def _for_stderr(name: str, d: int, n: int, target: float, delta: float) -> HistogramOption:
    def stderr(eps: float) -> float:
        return _stderr(histogram_mechanism(name, d, eps), n, d)

    cap = RAPPOR_CAP if name == "rappor" else EPS_LOCAL_CAP
    if stderr(cap) > target:
        return _option(name, d, n, delta, cap, False,
                       f"unreachable at n={n}: stderr {stderr(cap):.3g} even at eps_local={cap:g}")
    low, high = 0.0, cap  # stderr falls with eps; keep ``high`` meeting the target
    while high - low > REL_TOL * high:
        middle = 0.5 * (low + high)
        if stderr(middle) <= target:
            high = middle
        else:
            low = middle
    return _option(name, d, n, delta, high, True)


def plan_histogram(d: int, n: int, delta: float, *, epsilon_central: float | None = None,
                   target_stderr: float | None = None,
                   mechanisms: tuple[str, ...] = HISTOGRAM_MECHANISMS) -> HistogramPlan:
    """Plan every oracle of ``mechanisms`` for d categories and n clients against a central target
    ``epsilon_central`` (at ``delta``) or a per-item ``target_stderr`` (a fraction of n); exactly one of the two."""
    d, n = check_int("d", d, 2), check_int("n", n, 2)
    delta = check_delta("delta", delta)
    if (epsilon_central is None) == (target_stderr is None):
        raise ValueError("give exactly one of --epsilon_central and --target_stderr")
    unknown = [m for m in mechanisms if m not in HISTOGRAM_MECHANISMS]
    if unknown or not mechanisms:
        raise ValueError(f"histogram mechanisms to plan: {', '.join(HISTOGRAM_MECHANISMS)}; got {unknown or 'none'}")
    if epsilon_central is not None:
        target = check_epsilon("epsilon_central", epsilon_central)
        options = tuple(_for_central(m, d, n, target, delta) for m in mechanisms)
        best = min(options, key=lambda o: o.stderr)
    else:
        if not (isinstance(target_stderr, int | float) and math.isfinite(target_stderr) and 0 < target_stderr < 1):
            raise ValueError(f"--target_stderr is a frequency's standard error in (0, 1), got {target_stderr!r}")
        options = tuple(_for_stderr(m, d, n, float(target_stderr), delta) for m in mechanisms)
        reachable = [o for o in options if o.feasible]
        best = min(reachable, key=lambda o: o.eps_central) if reachable else None
    return HistogramPlan(d=d, n=n, delta=delta, eps_central_target=epsilon_central, target_stderr=target_stderr,
                         options=options, recommended=None if best is None else best.mechanism)


def format_histogram_plan(plan: HistogramPlan) -> str:
    """Human-readable table of the options, the recommended one marked with '*'."""
    if plan.target_stderr is not None:
        goal = f"per-item stderr {plan.target_stderr:g}"
    elif plan.eps_central_target is not None:
        goal = f"central eps_c={plan.eps_central_target:g}"
    else:
        goal = "per-window plans meeting a total budget"
    lines = [f"plan             histogram over d={plan.d} categories, n={plan.n} clients, delta={plan.delta:g}: {goal}",
             "stderr           per item, a fraction of n, at a uniform population (the mechanism's variance)",
             f"  {'mechanism':<10}{'eps_local':>11}{'eps_central':>13}{'stderr':>12}{'bits':>7}{'msgs':>8}"]
    for o in plan.options:
        mark = "*" if o.mechanism == plan.recommended else " "
        lines.append(f"{mark} {o.mechanism:<10}{o.eps_local:>11.5g}{o.eps_central:>13.5g}{o.stderr:>12.4g}"
                     f"{o.message_bits:>7}{o.messages_per_client:>8.3g}" + (f"  {o.note}" if o.note else ""))
    if plan.recommended is None:
        lines.append("recommended      none: no oracle reaches the target at this n")
    else:
        lines.append(f"recommended      {plan.recommended} (" + (
            "smallest central epsilon for the stderr)" if plan.target_stderr is not None
            else "smallest stderr within the privacy target)"))
    if any(o.mechanism == "rappor" for o in plan.options):
        lines.append("rappor           eps_local is a removal budget (Erlingsson et al.'s ESA; under replacement "
                     "2 eps); one message per set bit")
    lines += [f"note             {note}" for note in plan.notes]
    return "\n".join(lines)


@dataclass(frozen=True)
class HistogramWindowsPlan:
    """The histogram plan over W windows of one population: per mechanism, the per-window plan and the
    composed total (``plan_windows`` for a total budget; ``compose_releases`` for a stderr target)."""
    windows: int
    delta_total: float
    eps_central_total_target: float | None
    plan: HistogramPlan
    totals: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        out = self.plan.to_dict()
        out["windows"] = {"windows": self.windows, "delta_total": self.delta_total,
                          "eps_central_total_target": self.eps_central_total_target, "per_mechanism": self.totals}
        return out


def plan_histogram_windows(d: int, n: int, windows: int, delta_total: float, *,
                           epsilon_central_total: float | None = None, target_stderr: float | None = None,
                           mechanisms: tuple[str, ...] = HISTOGRAM_MECHANISMS) -> HistogramWindowsPlan:
    """Over W windows: each mechanism's largest per-window plan whose W-fold composition meets
    ``epsilon_central_total`` (``plan_for_windows``, verified by the composition), or the per-window plan for
    ``target_stderr`` with its composed total. The recommendation is made as in ``plan_histogram``."""
    from transforms.planning.windows import plan_for_windows
    from transforms.privacy.odometer import compose_releases

    windows = check_int("windows", windows, 1)
    delta = check_delta("delta", delta_total)
    if (epsilon_central_total is None) == (target_stderr is None):
        raise ValueError("with --windows give exactly one of --epsilon_central_total and --target_stderr")
    totals: dict[str, dict[str, Any]] = {}
    options = []
    for name in mechanisms:
        if epsilon_central_total is not None:
            result = plan_for_windows(
                lambda eps_c, delta_w, name=name: plan_histogram(d, n, delta_w, epsilon_central=eps_c,
                                                                 mechanisms=(name,)),
                n, windows, epsilon_central_total, delta)
            option = result.plan.options[0]
            totals[name] = {"eps_central_total": result.eps_central_total, "method": result.method,
                            "eps_central_window_target": result.eps_central_window_target,
                            "compositions": result.compositions}
        else:
            option = plan_histogram(d, n, delta / (2.0 * windows), target_stderr=target_stderr,
                                    mechanisms=(name,)).options[0]
            if option.feasible:
                eps, method = compose_releases([option.window_release(n, delta / (2.0 * windows))] * windows, delta)
                totals[name] = {"eps_central_total": eps, "method": method}
            else:
                totals[name] = {"eps_central_total": None, "method": "unreachable"}
        options.append(option)
    if epsilon_central_total is not None:
        best = min(options, key=lambda o: o.stderr).mechanism
    else:
        reachable = [o.mechanism for o in options if o.feasible]
        best = min(reachable, key=lambda m: totals[m]["eps_central_total"]) if reachable else None
    plan = HistogramPlan(d=d, n=n, delta=delta / (2.0 * windows), eps_central_target=None,
                         target_stderr=target_stderr, options=tuple(options), recommended=best,
                         notes=(f"per-window delta = delta_total / (2W) = {delta / (2.0 * windows):.3g}",))
    return HistogramWindowsPlan(windows=windows, delta_total=delta, eps_central_total_target=epsilon_central_total,
                                plan=plan, totals=totals)


def format_histogram_windows_plan(result: HistogramWindowsPlan) -> str:
    """The per-window table, then each mechanism's total over the windows."""
    goal = (f"total eps={result.eps_central_total_target:g}" if result.eps_central_total_target is not None
            else f"per-item stderr {result.plan.target_stderr:g} every window")
    lines = [format_histogram_plan(result.plan),
             f"windows          {result.windows} releases of the same population, {goal}, "
             f"delta_total={result.delta_total:g}"]
    for name, total in result.totals.items():
        eps = total["eps_central_total"]
        shown = "n/a" if eps is None else f"{eps:.6g}"
        target = total.get("eps_central_window_target")
        per_window = f"  per-window target {target:.6g}" if target is not None else ""
        lines.append(f"  {name:<10} total epsilon {shown}  [{total['method']}]{per_window}")
    return "\n".join(lines)
