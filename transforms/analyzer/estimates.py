"""Estimate rows of one opened release: per-item estimates with standard errors and a privacy ledger.

The analyzer folds a release's payload arrays into the mechanism's count accumulator (memory O(state), never
O(n)); the finished accumulator is decoded once into per-item estimates (``readout`` names the items of each
analysis kind), each row carrying the closed-form standard error, the raw unbiased estimate next to the post-
processed one, the numbers of messages and clients released, the local epsilon and the central epsilon for
exactly that many clients. Multi-message mechanisms are counted by their presence markers
(``records.count_clients``). A spec with a blanket (``[crowd] blanket_epsilon``) has m dummy reports in every
release: the counts are debiased for them, ``n_clients``/``n_reports`` are net of them, ``eps_central`` stays
the honest crowd's for the real clients (what the odometer composes), and ``parameters`` adds what holds
against any number of colluding devices.

The analyzer does not learn how many reports the shuffler deleted: ``n_deleted`` is null, because
publishing it next to ``n_reports`` would reveal the exact crowd size that the randomized deletion hides
(the shuffler's counters report deletions to its operator). A spec may opt in with
``[crowd] publish_deletions = true`` where the analyst is allowed to know crowd sizes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from schemas import SCHEMA_VERSION
from transforms.analyzer.readout import readout, readout_parameters
from transforms.mechanisms.base import Accumulator, Mechanism, replacement_local_epsilon
from transforms.mechanisms.frequency.blanket import require_blanket
from transforms.privacy import events
from transforms.privacy.blanket import epsilon_against_colluders
from transforms.spec import AnalysisSpec


@dataclass
class CrowdAccumulator:
    """The mechanism's count arrays plus the deletions the shuffler published (None: not published)."""

    counts: Accumulator
    deleted: int | None = None
    messages: int = 0  # released messages folded in (presence markers included)

    @property
    def n(self) -> int:
        return self.counts.n


def central_epsilon(mechanism: Mechanism, n: int, delta: float, reports_per_client: int = 1) -> float:
    """Central epsilon of n shuffled clients at total ``delta`` (``central_epsilon_bound``'s number)."""
    return central_epsilon_bound(mechanism, n, delta, reports_per_client)[0]


def central_epsilon_bound(mechanism: Mechanism, n: int, delta: float, reports_per_client: int = 1
                          ) -> tuple[float, str]:
    """(central epsilon of n shuffled clients at total ``delta``, the bound that gave it): the one computation
    of ``transforms.privacy.events.central_epsilon`` on the window's event (docs/mathematics.md §1.2, §1.4:
    the mechanism's own accountant, else the smallest valid shuffle bound, chained over k reports)."""
    result = events.central_epsilon(events.window_event(mechanism, n, delta, reports_per_client))
    return result.epsilon, result.bound


def estimate_rows(spec: AnalysisSpec, crowd_id: str | None, accumulator: CrowdAccumulator, window_start_ms: int,
                  window_end_ms: int) -> list[dict[str, Any]]:
    """Decode one crowd's accumulator into Estimate records (schemas/Estimate.avsc), one per item."""
    mechanism = spec.randomizer
    m = spec.crowd.blanket_dummies
    if m:  # the shuffler's dummies: removed from the counts in expectation (mechanisms.frequency.blanket)
        result = require_blanket(mechanism).blanket_estimate(accumulator.counts.counts, accumulator.n, m)
    else:
        result = accumulator.counts.estimate()
    k = spec.max_reports_per_client
    clients = int(accumulator.n) - m  # real clients: eps_central is the honest crowd's, of these alone
    eps_central, bound = central_epsilon_bound(mechanism, clients, spec.delta, k)
    common = {
        "schema_version": SCHEMA_VERSION,
        "spec_id": spec.spec_id,
        "analysis": spec.name,
        "window_start": window_start_ms,
        "window_end": window_end_ms,
        "crowd_id": crowd_id,
        "n_reports": int(accumulator.messages) - m,
        "n_clients": clients,
        "n_deleted": accumulator.deleted,
        # replacement notion like eps_central (rappor's removal budget is in parameters); k reports compose
        "eps_local": k * float(replacement_local_epsilon(mechanism)),
        "eps_central": eps_central,
        "delta": float(spec.delta),
        "mechanism": mechanism.name,
        "parameters": json.dumps({**_parameters(spec, mechanism, result), "eps_central_bound": bound,
                                  "eps_central_notion": EPS_CENTRAL_NOTION},
                                 sort_keys=True, default=str),
    }
    return [{**common, "item": item.name, "item_index": item.index, "estimate": item.estimate,
             "stderr": item.stderr, "raw_estimate": item.raw} for item in readout(spec, result)]


EPS_CENTRAL_NOTION = "replacement"  # every per-window eps_central: one client's value replaced, n public

COLLUDING_FRACTION = 0.1  # the published what-if: this share of the crowd's devices colludes with the analyst


HONEST_CROWD = "honest crowd: the other reports of the window come from devices that do not collude with the analyst"


def _honest_crowd(spec: AnalysisSpec, mechanism: Mechanism, n: int) -> dict[str, Any]:
    """eps_central's assumption, what it becomes when a tenth of the crowd colludes with the analyst, and
    what holds against any number of colluders.

    Colluding enrolled devices send reports the analyst knows, so they hide nobody: a victim is amplified only
    by the honest others. With c colluders the guarantee is the tight bound for the n - c honest reports
    (the victim's included); a lone victim among colluders keeps only its local epsilon -- unless the spec has
    a blanket: the shuffler's m dummies then hide it whoever colludes (``eps_central_any_colluders``), and
    with c colluders the smaller of the two bounds holds (``privacy.blanket.epsilon_against_colluders``).
    """
    colluders = math.ceil(COLLUDING_FRACTION * n)
    single = not mechanism.accounts_central and math.isfinite(float(mechanism.epsilon_local))
    k = spec.max_reports_per_client
    if not spec.crowd.blanket:
        out: dict[str, Any] = {"eps_central_assumes": f"{HONEST_CROWD}; against colluding enrolled devices only "
                                                      "eps_local holds for a device alone among them"}
        if single and n >= 2:
            out["eps_central_if_10pct_collude"] = central_epsilon(mechanism, n - colluders, spec.delta, k)
        return out
    m = spec.crowd.blanket_dummies
    any_colluders = require_blanket(mechanism).blanket_epsilon(m, spec.delta, k)
    out = {"eps_central_assumes": f"{HONEST_CROWD}; against any number of colluding enrolled devices "
                                  f"eps_central_any_colluders holds (the shuffler's {m} dummy reports)",
           "blanket_dummies": m, "eps_central_any_colluders": any_colluders}
    if n >= 2:
        honest = central_epsilon(mechanism, n - colluders, spec.delta, k)
        out["eps_central_if_10pct_collude"] = epsilon_against_colluders(honest, any_colluders)
    return out


def _parameters(spec: AnalysisSpec, mechanism: Mechanism, result: Any) -> dict[str, Any]:
    """The mechanism's public parameters, plus the ledger details a mechanism has beyond eps_local (local
    epsilon when 1..tau report fragments are exposed; a multi-message protocol's messages, bits and
    numerical accounting) and what a stored reader needs to answer queries (``readout``)."""
    out = dict(mechanism.parameters())
    if mechanism.epsilon_exposed(1) is not None:
        out["epsilon_exposed"] = {str(t): float(mechanism.epsilon_exposed(t))
                                  for t in range(1, mechanism.fragments + 1)}
    if mechanism.expected_messages is not None:
        out["expected_messages_per_client"] = float(mechanism.expected_messages)
    # privacy ledger (h-privacy): eps_central is replacement DP; [ESA]'s removal value here
    removal = mechanism.epsilon_central_removal(int(result.n), spec.delta) if int(result.n) >= 2 else None
    if removal is not None:
        out["eps_central_removal"] = float(removal)
    if mechanism.epsilon_replacement is not None:  # eps_local is the replacement value; the removal one here
        out["eps_local_removal"] = float(mechanism.epsilon_local)
    ledger = mechanism.ledger(int(result.n))
    if ledger is not None:
        out["ledger"] = ledger
    out.update(_honest_crowd(spec, mechanism, int(result.n)))
    extra = readout_parameters(spec, result)
    if extra:
        out["readout"] = extra
    return out
