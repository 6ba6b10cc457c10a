"""Shared fixtures: one real Apache Kafka broker per test session, unique topic names per test."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from pipelines.broker import BrokerError, LocalBroker


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
