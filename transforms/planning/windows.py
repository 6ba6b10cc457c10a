"""Planning against a budget for many windows: ``esa plan --windows W --epsilon_central_total E``.

A per-window plan (``plan_kv_mean``, ``plan_vector_mean``) turns a per-window central target into local
parameters. Over W windows the population's cost is the *composition* of W such releases (``odometer``),
which depends on each window's whole privacy curve, not only on its eps. So the search runs on the
per-window target c: plan at c, compose the W windows by privacy loss distributions, and bisect c for the
largest plan whose composed epsilon is <= E. The lower end of the bisection is always a plan that was
*verified* by the composition, so what is returned meets the budget whatever the shape of c -> composed eps
(monotone in every case we know; if it were not, only optimality would suffer).

A plan with one message per user enters the composition through its mixture alpha (tight shuffle PLD);
one with several messages per user (vector_mean with t > 1) through its per-window (eps_c, delta / (2 W))
guarantee as the canonical (eps, delta) pair, which dominates any (eps, delta)-DP window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transforms.privacy._checks import check_delta, check_epsilon, check_int
from transforms.privacy.odometer import PrivacyOdometer, WindowRelease, interval_for

__all__ = ["WindowsPlan", "format_windows_plan", "plan_for_windows"]

REL_TOL = 2e-3  # bisection on the per-window target: plans within 0.2% of the largest feasible one


@dataclass(frozen=True)
class WindowsPlan:
    """The per-window plan (``plan``) meeting a total budget over ``windows`` windows."""

    windows: int
    eps_central_total_target: float
    delta_total: float
    eps_central_total: float
    eps_central_window_target: float
    method: str
    compositions: int
    plan: Any

    def to_dict(self) -> dict[str, Any]:
        out = self.plan.to_dict()
        out["windows"] = {"windows": self.windows, "eps_central_total_target": self.eps_central_total_target,
                          "delta_total": self.delta_total, "eps_central_total": self.eps_central_total,
                          "eps_central_window_target": self.eps_central_window_target, "method": self.method,
                          "compositions": self.compositions, "notion": "replacement"}
        return out


def _release(plan: Any, n: int, delta_window: float) -> WindowRelease:
    own = getattr(plan, "window_release", None)  # a plan that knows its own window (histogram oracles)
    if callable(own):
        return own(n, delta_window)
    messages = getattr(plan, "t", None) if hasattr(plan, "eps_local_message") else 1
    if messages in (None, 1):
        eps = plan.eps_local_message if hasattr(plan, "eps_local_message") else plan.eps_local
        return WindowRelease(plan.alpha, eps, n)
    return WindowRelease.approximate(plan.eps_central, delta_window, n)


def plan_for_windows(make_plan: Callable[[float, float], Any], n: int, windows: int, epsilon_total: float,
                     delta_total: float) -> WindowsPlan:
    """Largest per-window plan ``make_plan(eps_window_target, delta_window)`` whose W-fold composition
    meets (epsilon_total, delta_total)."""
    n = check_int("n", n, 2)
    windows = check_int("windows", windows, 1)
    target = check_epsilon("epsilon_central_total", epsilon_total)
    delta = check_delta("delta", delta_total)
    delta_window = delta / (2.0 * windows)
    count = 0

    def composed(eps_window: float) -> tuple[float, str, Any]:
        nonlocal count
        count += 1
        plan = make_plan(eps_window, delta_window)
        scale = float(getattr(plan, "eps_central", None) or eps_window)  # the analyzer's grid rule
        odometer = PrivacyOdometer(delta, interval_for(scale))
        odometer.extend([_release(plan, n, delta_window)] * windows)
        # a plan meets (E, delta) in total: its windows' delta terms inside delta, not added to it
        return odometer.epsilon_within(delta), odometer.method, plan

    # Basic composition makes target / W per window (at delta / (2W)) feasible up to the PLD's rounding;
    # verify it rather than trust it, shrinking until it holds.
    low = target / windows
    best = composed(low)
    while best[0] > target:
        low /= 2.0
        if low < 1e-6:
            raise ValueError(f"no plan meets eps_total={target:g} over {windows} windows")
        best = composed(low)
    high = target
    top = composed(high)
    if top[0] <= target:
        low, best = high, top
    else:
        while high - low > REL_TOL * high:
            middle = 0.5 * (low + high)
            trial = composed(middle)
            if trial[0] <= target:
                low, best = middle, trial
            else:
                high = middle
    eps, method, plan = best
    return WindowsPlan(windows=windows, eps_central_total_target=target, delta_total=delta,
                       eps_central_total=eps, eps_central_window_target=low, method=method, compositions=count,
                       plan=plan)


def format_windows_plan(result: WindowsPlan, per_window_text: str) -> str:
    """The per-window plan's text followed by the composition over the windows."""
    lines = [
        per_window_text,
        f"windows          {result.windows} releases of the same population (one report per client each)",
        f"total target     eps={result.eps_central_total_target:g}, delta={result.delta_total:g}",
        f"per-window plan  at eps_c={result.eps_central_window_target:.6g}, delta={result.delta_total:g}/(2W)",
        f"total epsilon    {result.eps_central_total:.6g}  (replacement, no crowd count charged)  [{result.method}]",
    ]
    return "\n".join(lines)
