"""Fault injection for the crash tests: a named point where the process SIGKILLs itself when asked.

Why in the library: the points sit inside the domains' release steps (after a seal, after a publish), which must
not import the jobs; the jobs' own points use the same function.
"""

from __future__ import annotations

import logging
import os

LOG = logging.getLogger(__name__)

CRASH_ENV = "ESA_CRASH_AT"  # fault injection for tests: kill -9 this process at a named point


def crash_point(name: str) -> None:
    """SIGKILL ourselves at ``name`` if the test harness asked for it (``ESA_CRASH_AT=name``)."""
    if os.environ.get(CRASH_ENV) == name:
        LOG.warning("fault injection: SIGKILL at %s", name)
        os.kill(os.getpid(), 9)
