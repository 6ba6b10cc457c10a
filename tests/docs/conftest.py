"""The Quick start's demo, run once per session for the docs tests that need it.

Why shared: the README test checks the demo's own output and docs/querying.md's commands read the ``out/demo``
the Quick start leaves; both ran the very same command (the README's, at 2,000 clients: a broker, an edge and
three jobs) each time."""

from __future__ import annotations

import pytest

from tests.docs.readme_commands import QuickStart, run_quick_start


@pytest.fixture(scope="session")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    """The Quick start's demo in a fresh directory. Tests that write under its ``out`` copy it first: no check
    may depend on the order tests run in."""
    return run_quick_start(tmp_path_factory.mktemp("quickstart"))
