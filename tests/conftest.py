"""Shared fixtures: one real Apache Kafka broker per test session (per pytest-xdist worker), unique topic names
per test; and the grouping that keeps costly shared fixtures whole when the suite runs on several workers."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.broker import BrokerError, LocalBroker

TESTS = Path(__file__).resolve().parent
ONE_WORKER_FOLDERS = ("flink",)  # a folder whose tests share a costly session (one Flink cluster, one job server)


def xdist_group_of(item: pytest.Item) -> str | None:
    """The group whose tests one pytest-xdist worker runs (``--dist loadgroup``), or None to spread freely.

    Why: each worker is its own session, so a fixture wider than a test is made once per worker that needs it.
    The Flink folder shares one cluster and job server (tests/flink/conftest.py), costly and memory-hungry: its
    tests go to one worker. A module whose tests share a module (or class) fixture -- typically a pipeline run
    whose outputs several tests check -- stays on one worker so that run happens once. Session fixtures of the
    root conftest (the broker) and pytest's own are meant per worker: they do not group."""
    try:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    if parts[0] in ONE_WORKER_FOLDERS:
        return parts[0]
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(chain[-1].scope in ("module", "class", "package") for chain in defs if chain):
        return "/".join(parts)
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def broker() -> Iterator[LocalBroker]:
    """A started Apache Kafka on loopback. Fails (never skips) when it cannot start: CI installs Java and
    Maven, so a missing broker is a broken environment, not an optional feature."""
    try:
        local = LocalBroker().start()
    except BrokerError as exc:
        pytest.fail(f"cannot start the local Kafka broker: {exc}\n{exc.detail}", pytrace=False)
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test run (the broker keeps topics for the whole session)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:80]
    return f"{stem}-{uuid.uuid4().hex[:8]}"
