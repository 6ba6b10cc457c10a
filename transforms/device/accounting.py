"""What one report costs a device's budget, given what the device has already reported this epoch.

Every charge is a *replacement* LDP epsilon (the device's value replaced by another one), the notion the
analyzer's ledger publishes, so charges of different mechanisms add up in one unit. [ESA]'s unary encodings
(``rappor``, ``rappor_fragments``) state removal budgets (one bit against the all-zero vector); a
replacement changes two bits of the one-hot vector, whose randomizations are independent, so their
replacement epsilon is twice the removal one (``epsilon_replacement``).

* **Single-randomization mechanisms** (grr, olh, oue, ...): the mechanism's replacement epsilon, every time.
* **Permanent randomization** (``rappor_fragments``): the device memoizes one backstop per value and sends
  tau fresh fragments of it per report. k reports of one value are k*tau independent eps_f-RR views of the
  same backstop, together eps(k tau) = ``fragment_epsilon(eps_b, eps_f, k tau)``-LDP per bit ([ESA]
  Thm IV.1, removal; at most eps_b however large k). The k-th report of a value in an epoch therefore costs
  ``2 (eps(k tau) - eps((k - 1) tau))`` (replacement: two bits), and the epoch's charges for that value sum
  to exactly the replacement loss of the epoch's reports. Epochs share the backstop, so they do not compose
  as independent mechanisms; but all reports of a value together are 2 eps(K tau)-LDP, and
  eps(s) = ln((e^(eps_b+s) + 1)/(e^eps_b + e^s)) is concave in s = t eps_f with eps(0) = 0, hence
  subadditive: the sum of every epoch's charges bounds them. (eps depends on the fragments only through
  s, the sum of their eps_f, so a spec edit that changes tau or eps_f but keeps the backstop -- ``memo.py``
  -- is bounded the same way: the new spec's charges start again from its first report.)
* **Shuffle-only protocols** ([MultiMsg]'s multi-message protocols: ``epsilon_local`` is infinite): no local
  guarantee exists, so a report is charged the per-window *central* target epsilon of its spec -- the loss
  it causes once shuffled with its crowd, which assumes the shuffler is honest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from transforms.device.memo import is_memoizing
from transforms.mechanisms.base import replacement_local_epsilon
from transforms.privacy.composition import fragment_epsilon

__all__ = ["ReportCost", "replacement_epsilon", "report_cost"]

#: Removal -> replacement for [ESA]'s one-hot unary encodings: a replacement changes two independent bits.
UNARY_REPLACEMENT_FACTOR = 2.0


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
        removal = fragment_epsilon(eps_b, eps_f, k * tau) - fragment_epsilon(eps_b, eps_f, (k - 1) * tau)
        rule = (f"report {k} of this value this epoch, {tau} fresh fragments of its permanent backstop: "
                f"2 (eps({k * tau}) - eps({(k - 1) * tau})) with eps_b={eps_b:g}, eps_f={eps_f:g} "
                "([ESA] Thm IV.1; replacement LDP)")
        return ReportCost(max(0.0, UNARY_REPLACEMENT_FACTOR * removal), rule, f"{spec_id}|{value_key}")
    local = replacement_epsilon(mechanism)
    if math.isinf(local):
        return ReportCost(float(mechanism.epsilon), f"{mechanism.name} has no local guarantee (privacy from the "
                          "shuffle only): charged its per-window central target epsilon (replacement)")
    return ReportCost(local, f"replacement LDP epsilon of {mechanism.name}")


def replacement_epsilon(mechanism: Any) -> float:
    """The mechanism's local epsilon under replacement (``mechanisms.base.replacement_local_epsilon``)."""
    return replacement_local_epsilon(mechanism)
