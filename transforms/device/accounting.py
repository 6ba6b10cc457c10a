"""What one report costs a device's budget, given what the device has already reported this epoch.

* **Single-randomization mechanisms** (grr, olh, oue, ...): the mechanism's ``epsilon_local``, every time
  (in the mechanism's own neighbouring relation: replacement for most, removal for [ESA]'s unary encodings).
* **Permanent randomization** (``rappor_fragments``): the device memoizes one backstop per value and sends
  tau fresh fragments of it per report. k reports of one value are k*tau independent eps_f-RR views of the
  same backstop, together eps(k tau) = ``fragment_epsilon(eps_b, eps_f, k tau)``-LDP ([ESA] Thm IV.1; at most
  eps_b however large k). The k-th report of a value in an epoch therefore costs
  ``eps(k tau) - eps((k - 1) tau)``: the epoch's charges for that value sum to exactly the loss of the
  epoch's reports. Epochs share the backstop, so they do not compose as independent mechanisms; but all
  reports of a value together are eps(K tau)-LDP, and eps(s) = ln((e^(eps_b+s) + 1)/(e^eps_b + e^s)) is
  concave in s = t eps_f with eps(0) = 0, hence subadditive: the sum of every epoch's charges bounds them.
* **Shuffle-only protocols** ([MultiMsg]'s multi-message protocols: ``epsilon_local`` is infinite): no local
  guarantee exists, so a report is charged the per-window *central* target epsilon of its spec -- the loss
  it causes once shuffled with its crowd, which assumes the shuffler is honest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from transforms.device.memo import is_memoizing
from transforms.privacy.composition import fragment_epsilon

__all__ = ["ReportCost", "report_cost"]


@dataclass(frozen=True)
class ReportCost:
    """The epsilon a report draws from the budget, the rule that gave it, and the per-epoch counter it bumps."""

    epsilon: float
    rule: str
    count_key: str | None = None


def report_cost(mechanism: Any, spec_id: str, value_key: str | None, earlier: int) -> ReportCost:
    """Cost of the next report; ``earlier``: reports of this (spec, value) already charged in this epoch
    (only read for memoizing mechanisms, whose ``value_key`` names the memoized value)."""
    if is_memoizing(mechanism):
        eps_b, eps_f, tau = mechanism.epsilon_backstop, mechanism.eps_f, mechanism.fragments
        k = earlier + 1
        cost = fragment_epsilon(eps_b, eps_f, k * tau) - fragment_epsilon(eps_b, eps_f, (k - 1) * tau)
        rule = (f"report {k} of this value this epoch, {tau} fresh fragments of its permanent backstop: "
                f"eps({k * tau}) - eps({(k - 1) * tau}) with eps_b={eps_b:g}, eps_f={eps_f:g} ([ESA] Thm IV.1)")
        return ReportCost(max(0.0, cost), rule, f"{spec_id}|{value_key}")
    local = float(mechanism.epsilon_local)
    if math.isinf(local):
        return ReportCost(float(mechanism.epsilon), f"{mechanism.name} has no local guarantee (privacy from the "
                          "shuffle only): charged its per-window central target epsilon")
    return ReportCost(local, f"epsilon_local of {mechanism.name}")
