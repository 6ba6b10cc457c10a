"""``--follow`` waits for a missing input topic instead of dying (jobs are started side by side), and waits
out a full disk."""

from __future__ import annotations

import errno
import logging
from types import SimpleNamespace

import pytest

from pipelines import service
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


def test_follow_outlasts_a_full_disk_and_backs_off(monkeypatch, caplog: pytest.LogCaptureFixture) -> None:
    """A run refused for lack of space is retried after a growing pause; the first success resets it."""
    pauses: list[int] = []
    monkeypatch.setattr(service, "out_of_space_pause", lambda _poll, refused: pauses.append(refused) or 0.0)
    run = SimpleNamespace(stage="shuffle", parts={}, seconds=1.0, count=lambda _name: 1)
    script = iter([OSError(errno.ENOSPC, "No space left on device", "/state/staging/x.spill"),
                   RuntimeError("OSError: [Errno 28] No space left on device [while running 'Ingress']"),
                   run,
                   OSError(errno.EDQUOT, "Disk quota exceeded"),
                   run])

    def run_once() -> SimpleNamespace:
        step = next(script)
        if isinstance(step, BaseException):
            raise step
        return step

    with caplog.at_level(logging.ERROR, logger="esa.service"):
        summaries = follow(run_once, poll_seconds=0.01, max_runs=2)
    assert summaries == [run, run]
    assert pauses == [1, 2, 1]  # counted per streak: the success in between started it over
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3 and "'/state/staging/x.spill'" in errors[0] and "[Errno 122]" in errors[2]
    assert all("Nothing is lost" in e for e in errors)


def test_follow_does_not_retry_other_os_errors() -> None:
    def run_once() -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/state")

    with pytest.raises(PermissionError):
        follow(run_once, poll_seconds=0.01, max_runs=1)


def test_out_of_space_pause_doubles_from_the_poll_interval_up_to_five_minutes() -> None:
    assert [service.out_of_space_pause(5.0, k) for k in (1, 2, 3, 6, 7, 50)] == [5, 10, 20, 160, 300, 300]
    assert service.out_of_space_pause(0.01, 1) == 5.0  # never spins
    assert service.out_of_space_pause(30.0, 2) == 60.0
