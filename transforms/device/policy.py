"""The device's one budget: its limit and epoch length, stored in the state directory, and how it changes.

A limit held by each ``Client`` object let a second client with a looser limit, or none, spend past the
device's limit on the same ledger, and an hourly client reset a daily ledger every hour. So the first
budgeted client on a state directory stores its budget in ``state_dir/budget_policy.json``::

    {"format": 1, "epsilon_per_epoch": 4.0, "epoch_seconds": 86400, "set_at": 1764000000,
     "next": {"epsilon_per_epoch": 8.0, "epoch_seconds": 86400, "from": 1764028800}}

and every later client must pass that budget (or the pending ``next`` one); another limit, another epoch
length, or no budget is refused with ``BudgetConflict``. The budget in force decides the accounting,
whatever a client passed.

**Changing it** (``change_budget``, e.g. by an app update): a tighter limit with the same epoch length,
or any change while the current epoch has no report, applies at once. Anything else -- a looser limit or
another epoch length -- is stored as ``next`` and takes effect when the current epoch ends, so an epoch
is never accounted under two limits. Clients with either budget are accepted meanwhile; after the switch
the old budget is refused. (Under a new epoch length, reports made before the switch inside the first new
epoch are not counted against it: only the last epoch's ledger is kept.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transforms.device.budget import BUDGET_FILE, Budget, Ledger
from transforms.device.state import StateError, locked, read_json, state_directory, write_json

__all__ = ["POLICY_FILE", "BudgetConflict", "Policy", "change_budget", "check_policy", "read_policy",
           "stored_budget"]

POLICY_FILE = "budget_policy.json"
POLICY_FORMAT = 1


class BudgetConflict(ValueError):  # noqa: N818 -- named like BudgetExceeded, its sibling in the device API
    """A client whose budget is not the device's: the state directory holds another limit or epoch (or a
    budget where the client has none, or a ledger without a limit). Nothing was reported or spent."""


def _describe(budget: Budget | None) -> str:
    if budget is None:
        return "no budget"
    return f"Budget(epsilon_per_epoch={budget.epsilon_per_epoch:g}, epoch_seconds={budget.epoch_seconds})"


@dataclass(frozen=True)
class Policy:
    """The stored budget, and a pending one that replaces it from ``next_from`` on."""

    budget: Budget
    set_at: int
    next: Budget | None = None
    next_from: int | None = None

    def due(self, now: float) -> Policy:
        """This policy as it stands at ``now``: a pending budget whose time has come is the budget."""
        if self.next is not None and self.next_from is not None and now >= self.next_from:
            return Policy(self.next, self.next_from)
        return self

    def accepts(self, budget: Budget | None) -> bool:
        return budget is not None and budget in (self.budget, self.next)

    def describe(self) -> str:
        pending = f" (and {_describe(self.next)} from {self.next_from})" if self.next is not None else ""
        return _describe(self.budget) + pending

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": POLICY_FORMAT, "epsilon_per_epoch": self.budget.epsilon_per_epoch,
                               "epoch_seconds": self.budget.epoch_seconds, "set_at": self.set_at}
        if self.next is not None:
            out["next"] = {"epsilon_per_epoch": self.next.epsilon_per_epoch,
                           "epoch_seconds": self.next.epoch_seconds, "from": self.next_from}
        return out


def read_policy(state_dir: Path) -> Policy | None:
    """The stored policy (None if no budgeted client ever ran there); ``StateError`` if it is unusable.

    Safe without the lock (the file is replaced atomically); a decision that writes must hold it.
    """
    path = Path(state_dir) / POLICY_FILE
    raw = read_json(path)
    if raw is None:
        return None
    try:
        if raw["format"] != POLICY_FORMAT:
            raise StateError(f"{path}: unknown budget policy format {raw['format']!r}")
        budget = Budget(float(raw["epsilon_per_epoch"]), int(raw["epoch_seconds"]))
        nxt = raw.get("next")
        if nxt is None:
            return Policy(budget, int(raw["set_at"]))
        return Policy(budget, int(raw["set_at"]), Budget(float(nxt["epsilon_per_epoch"]), int(nxt["epoch_seconds"])),
                      int(nxt["from"]))
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, StateError):
            raise
        raise StateError(f"{path}: malformed budget policy ({type(err).__name__}: {err})") from None


def stored_budget(state_dir: Path | str, now: float | None = None) -> Budget | None:
    """The device's budget in force at ``now`` (default: the wall clock), for a client that should use it."""
    policy = read_policy(Path(state_dir))
    return None if policy is None else policy.due(time.time() if now is None else now).budget


def _write(state_dir: Path, policy: Policy) -> None:
    write_json(state_dir / POLICY_FILE, policy.to_json())


def check_policy(state_dir: Path, budget: Budget | None, now: float) -> Budget | None:
    """The budget in force, once ``budget`` is found acceptable (call under the state lock). The first budgeted
    client on a state directory stores its budget; a due pending budget is made the budget. Raises
    ``BudgetConflict`` for a budget the device does not have."""
    state_dir = Path(state_dir)
    stored = read_policy(state_dir)
    if stored is None:
        if budget is not None:
            _write(state_dir, Policy(budget, int(now)))
            return budget
        if not (state_dir / BUDGET_FILE).exists():
            return None
        held = "a budget ledger (budget.json) without a stored limit"
    else:
        policy = stored.due(now)
        if policy != stored:
            _write(state_dir, policy)
        if policy.accepts(budget):
            return policy.budget
        held = policy.describe()
    raise BudgetConflict(
        f"{state_dir}: this device's state carries {held}, but the client was given {_describe(budget)}; "
        "a device has one budget shared by all its clients -- pass the stored one "
        "(transforms.device.stored_budget(state_dir)) or change it with transforms.device.change_budget")


def change_budget(state_dir: Path | str, budget: Budget, *, now: float | None = None) -> int:
    """Make ``budget`` the device's budget; returns when it takes effect (seconds since the Unix epoch).

    At once if it is no looser than the current one (same epoch length, limit not higher), or if the device
    has no budget or no report in the current epoch; otherwise when the current epoch ends.
    """
    if not isinstance(budget, Budget):
        raise TypeError(f"budget must be a Budget, got {type(budget).__name__}")
    state_dir = state_directory(Path(state_dir))
    now = time.time() if now is None else float(now)
    with locked(state_dir):
        stored = read_policy(state_dir)
        current = stored.due(now) if stored is not None else None
        if current is None or current.budget == budget:
            _write(state_dir, Policy(budget, current.set_at if current is not None else int(now)))
            return int(now)
        old = current.budget
        ledger = Ledger.load(state_dir / BUDGET_FILE, old, now)
        tighter = budget.epoch_seconds == old.epoch_seconds and budget.epsilon_per_epoch <= old.epsilon_per_epoch
        if tighter or ledger.reports == 0:
            _write(state_dir, Policy(budget, int(now)))
            return int(now)
        _write(state_dir, Policy(old, current.set_at, budget, ledger.renews_at))
        return ledger.renews_at
