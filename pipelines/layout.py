"""The import packages ``pipelines``, ``transforms`` and ``schemas`` are also names of unrelated PyPI projects.

The layout is fixed (every module, test and deployment imports these names), so a same-named project
installed in the same environment can shadow one of ours: whichever comes first on ``sys.path`` wins, and
the loser's modules fail with confusing ImportErrors (or, worse, half work). ``esa`` checks at start that
``transforms`` and ``schemas`` resolve beside its own ``pipelines`` and otherwise refuses in one line naming
the intruder (a shadowed ``pipelines`` cannot run ``esa`` at all: Python then reports the missing
``pipelines.cli``). The check finds the packages without importing them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SIBLINGS = ("transforms", "schemas")


def foreign_packages() -> list[tuple[str, str]]:
    """(name, where it was found) of every sibling package that is not the one beside this ``pipelines``."""
    root = Path(__file__).resolve().parent.parent
    foreign = []
    for name in SIBLINGS:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is None or Path(origin).resolve().parent.parent != root:
            foreign.append((name, str(origin or "nowhere")))
    return foreign


def layout_error() -> str | None:
    """One line for the operator when a same-named project shadows ours, else None."""
    foreign = foreign_packages()
    if not foreign:
        return None
    found = "; ".join(f"{name} from {where}" for name, where in foreign)
    return (f"the import package(s) {found} are not esa-telemetry's (expected beside "
            f"{Path(__file__).resolve().parent}): an unrelated PyPI project of the same name is installed in this "
            "environment. Uninstall it (pip uninstall) or give esa its own virtual environment")
