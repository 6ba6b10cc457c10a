"""A device's privacy budget: one epsilon per epoch (e.g. per day) across every spec the device reports on.

**One budget per device.** The limit and the epoch length are a property of the device, not of a ``Client``
object: they are stored in the state directory (``policy.py``), and a client asking for another budget,
or none, is refused.

Every charge is in one neighbouring notion, *replacement* LDP (one device's value replaced by another),
the notion the analyzer's ledger publishes; ``accounting.py`` converts removal budgets ([ESA]'s unary
encodings) to it.

The ledger of the current epoch lives in ``state_dir/budget.json``::

    {"format": 1, "epoch_start": 1764000000, "renews_at": 1764086400, "spent": 1.25, "reports": 3,
     "counts": {"<spec_id>|<value>": 2}}

``counts`` holds, for mechanisms with permanent randomization, how many reports of each (spec, value) this
epoch has charged: their cost depends on it (``accounting.py``). The whole ledger renews at ``renews_at``.

Epochs follow the device's wall clock at encode time, not the event time a caller passes (a back-dated
event must not draw on an epoch that already ended). A stored epoch stays in force until its ``renews_at``
whatever the clock says before it, so setting the clock back never renews a budget; only a clock set
forward can, which no client-side accounting can prevent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from transforms.device.state import StateError, read_json, write_json

__all__ = ["BUDGET_FILE", "Budget", "BudgetExceeded", "BudgetStatus", "Ledger"]

BUDGET_FILE = "budget.json"
FORMAT = 1
# Relative slack when comparing a sum of float charges with the limit: ten reports of 0.1 fit a budget of 1.
TOLERANCE = 1e-9


@dataclass(frozen=True)
class Budget:
    """At most ``epsilon_per_epoch`` of local privacy loss per ``epoch_seconds`` (epochs aligned to the Unix
    epoch, so daily epochs renew at 00:00 UTC)."""

    epsilon_per_epoch: float
    epoch_seconds: int = 86400

    def __post_init__(self) -> None:
        eps = self.epsilon_per_epoch
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"epsilon_per_epoch must be a finite number > 0, got {eps!r}")
        seconds = self.epoch_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
            raise ValueError(f"epoch_seconds must be an integer >= 1, got {seconds!r}")
        object.__setattr__(self, "epsilon_per_epoch", float(eps))


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class BudgetStatus:
    """The budget of the current epoch as the device sees it (``Client.status()``)."""

    limit: float
    spent: float
    remaining: float
    reports: int
    epoch_start: int
    renews_at: int

    def __str__(self) -> str:
        return (f"spent {self.spent:.6g} of {self.limit:.6g} (remaining {self.remaining:.6g}) over {self.reports} "
                f"report(s) in the epoch {_iso(self.epoch_start)} .. {_iso(self.renews_at)}")


class BudgetExceeded(RuntimeError):  # noqa: N818 -- the name the device API promises
    """A report that would exceed the epoch's budget: it was not produced, and nothing was spent."""

    def __init__(self, cost: float, rule: str, status: BudgetStatus, now: float):
        wait = max(0, math.ceil(status.renews_at - now))
        super().__init__(
            f"report refused: it would cost epsilon {cost:.6g} ({rule}), but {status.spent:.6g} of the epoch's "
            f"{status.limit:.6g} is spent (remaining {status.remaining:.6g}) in the epoch that began "
            f"{_iso(status.epoch_start)}; the budget renews at {_iso(status.renews_at)} (in {wait // 3600}h "
            f"{wait % 3600 // 60:02d}m)")
        self.cost, self.rule, self.status = cost, rule, status


@dataclass
class Ledger:
    """The current epoch's spending, read from and written to ``budget.json`` under the state lock."""

    epoch_start: int
    renews_at: int
    spent: float = 0.0
    reports: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def fresh(cls, budget: Budget, now: float) -> Ledger:
        start = int(now // budget.epoch_seconds) * budget.epoch_seconds
        return cls(epoch_start=start, renews_at=start + budget.epoch_seconds)

    @classmethod
    def load(cls, path: Path, budget: Budget, now: float) -> Ledger:
        """The ledger in force at ``now``: the stored one until its ``renews_at``, else a fresh epoch."""
        raw = read_json(path)
        if raw is None:
            return cls.fresh(budget, now)
        ledger = cls._parse(path, raw)
        return ledger if now < ledger.renews_at else cls.fresh(budget, now)

    @classmethod
    def _parse(cls, path: Path, raw: dict[str, Any]) -> Ledger:
        try:
            if raw["format"] != FORMAT:
                raise StateError(f"{path}: unknown budget format {raw['format']!r}")
            counts = {str(k): int(v) for k, v in raw["counts"].items()}
            ledger = cls(epoch_start=int(raw["epoch_start"]), renews_at=int(raw["renews_at"]),
                         spent=float(raw["spent"]), reports=int(raw["reports"]), counts=counts)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            if isinstance(err, StateError):
                raise
            raise StateError(f"{path}: malformed budget ledger ({type(err).__name__}: {err})") from None
        if not math.isfinite(ledger.spent) or ledger.spent < 0 or ledger.renews_at <= ledger.epoch_start:
            raise StateError(f"{path}: impossible budget ledger (spent {ledger.spent}, epoch "
                             f"{ledger.epoch_start}..{ledger.renews_at})")
        return ledger

    def save(self, path: Path) -> None:
        write_json(path, {"format": FORMAT, "epoch_start": self.epoch_start, "renews_at": self.renews_at,
                          "spent": self.spent, "reports": self.reports, "counts": self.counts})

    def status(self, limit: float) -> BudgetStatus:
        return BudgetStatus(limit=limit, spent=self.spent, remaining=max(0.0, limit - self.spent),
                            reports=self.reports, epoch_start=self.epoch_start, renews_at=self.renews_at)

    def fits(self, cost: float, limit: float) -> bool:
        return self.spent + cost <= limit * (1.0 + TOLERANCE)

    def charge(self, cost: float, count_key: str | None) -> None:
        self.spent += cost
        self.reports += 1
        if count_key is not None:
            self.counts[count_key] = self.counts.get(count_key, 0) + 1
