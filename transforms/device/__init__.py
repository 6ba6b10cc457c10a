"""The device-side client: what a phone or a laptop runs to report one telemetry value privately.

``Client(spec, state_dir, ...)`` randomizes a value with the spec's local randomizer, charges the device's
privacy budget, seals every message to the analyzer, signs the message set with the device's key and seals
the whole set to the shuffler (nested encryption); the bytes it returns are what the shuffler's ingestion
accepts. Nothing here imports Beam or Kafka.

Usage (key ids and public keys come from the ``keys/public/`` directory)::

    from transforms.device import Budget, BudgetExceeded, Client
    from transforms.spec import load_spec
    from transforms.trust import load_analyzer_public, load_shuffler_sealing_public

    (a_id, a_key), (s_id, s_key) = load_analyzer_public("keys"), load_shuffler_sealing_public("keys")
    client = Client(load_spec("examples/app_language.toml"), "device-state", analyzer_public_key=a_key,
                    analyzer_key_id=a_id, shuffler_public_key=s_key, shuffler_key_id=s_id, budget=Budget(8.0))
    print("enrol:", client.device_id, client.public_key.hex())  # once, into the shuffler's device registry
    try:
        message_set = client.encode("fr")  # the sealed, signed set: produce it to the shuffler's topic
    except BudgetExceeded as refused:
        print(refused)                     # what it would cost, spent / limit, when the budget renews
    print(client.status())

What persists in ``state_dir`` (``state.py``): the device key, the device's one budget (its limit and epoch,
set by the first budgeted client, changed only by ``change_budget``; a client with another budget, or none,
is refused: ``policy.py``) and the spend of the
current epoch across every spec the device reports on, in replacement-LDP epsilon (``budget.py``, cost
rules in ``accounting.py``), and permanent randomization such as [ESA]'s backstop, drawn once per (metric,
backstop parameters, value) and reused by every later report (``memo.py``). What a reinstall (a wiped state
directory) means for privacy: docs/device-privacy.md.
"""

from transforms.device.accounting import ReportCost, report_cost
from transforms.device.budget import Budget, BudgetExceeded, BudgetStatus
from transforms.device.client import Client
from transforms.device.memo import MemoStore, is_memoizing
from transforms.device.policy import BudgetConflict, change_budget, stored_budget
from transforms.device.state import StateError

__all__ = [
    "Budget",
    "BudgetConflict",
    "BudgetExceeded",
    "BudgetStatus",
    "Client",
    "MemoStore",
    "ReportCost",
    "StateError",
    "change_budget",
    "is_memoizing",
    "report_cost",
    "stored_budget",
]
