"""``--follow`` waits for a missing input topic instead of dying (jobs are started side by side)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from pipelines.preflight import MissingTopicsError
from pipelines.service import follow


def test_follow_waits_for_a_missing_topic_then_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}
    run = SimpleNamespace(stage="analyze", parts={}, seconds=1.0, count=lambda _name: 1)

    def run_once() -> SimpleNamespace:
        calls["n"] += 1
        if calls["n"] <= 3:
            raise MissingTopicsError("topic(s) 'shuffled' do not exist")
        return run

    with caplog.at_level(logging.WARNING, logger="esa.service"):
        summaries = follow(run_once, poll_seconds=0.01, max_runs=2)
    assert summaries == [run, run] and calls["n"] == 5
    waits = [r for r in caplog.records if "waiting for the input topic" in r.getMessage()]
    assert len(waits) == 1  # logged once per distinct error, not once per poll


def test_follow_does_not_swallow_other_errors() -> None:
    def run_once() -> None:
        raise ValueError("bad spec")

    with pytest.raises(ValueError, match="bad spec"):
        follow(run_once, poll_seconds=0.01, max_runs=1)
