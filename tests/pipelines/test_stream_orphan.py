"""A streaming driver whose job server dies under it (``pipelines.stream_orphan.keep_lost_job``), the cluster's
REST API stubbed: its job is stopped into a savepoint (never cancelled), its run's accounting carried and the
lineage marked so that the same command run again resumes from that savepoint unasked; a savepoint that fails
leaves the job running and says so. The cluster itself is in tests/flink/test_orphan_stream.py."""

from __future__ import annotations

import time
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import flink_drain, stream_accounting, stream_orphan
from pipelines.exit_codes import ExitCode, RunnerLostError
from pipelines.stream_accounting import Lineage
from transforms.state.layout import StateDir
from transforms.state.ledger import ReleaseLedger

REST = "127.0.0.1:1"
LOST = stream_orphan.JobServerLostError(REST, "esa-stream-abc", "jid-1", "127.0.0.1:2", "Socket closed")


def _config(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    return SimpleNamespace(state=state, state_layout=StateDir(state))


def _agent(steps: list[int]) -> SimpleNamespace:
    totals = SimpleNamespace(sets_decided=12, sets_released=10, dead_letters=1)
    return SimpleNamespace(totals=totals, step=lambda: steps.append(1))


def test_a_lost_job_server_stops_the_job_into_a_savepoint_and_the_rerun_resumes_it(tmp_path, monkeypatch) -> None:
    config, steps = _config(tmp_path), []
    lineage = Lineage({0: 3}, dict.fromkeys(stream_accounting.CARRIED, 1), live="stream-b")
    lineage.save(config.state)
    stops = []
    monkeypatch.setattr(stream_orphan, "stop_with_savepoint",
                        lambda rest, jid, timeout_s: stops.append((rest, jid)) or "file:/sp/savepoint-1")
    err = stream_orphan.keep_lost_job(config, lineage, _agent(steps), LOST)
    assert err.exit_code == ExitCode.RUNNER_LOST and stops == [(REST, "jid-1")] and steps == [1]
    assert "\n" not in str(err) and "was stopped into savepoint file:/sp/savepoint-1;" in str(err)
    assert str(err).endswith("run the same command again (it resumes from it)")
    assert stream_accounting.resumable(config.state) == "file:/sp/savepoint-1"

    options = PipelineOptions(["--runner=FlinkRunner", f"--flink_master={REST}", "--savepoint_path=file:/old"])
    monkeypatch.setattr(stream_orphan, "live_jobs", lambda rest, name: [])  # the stopped job is FINISHED
    assert stream_orphan.resume_orphan(config, None, options) == "file:/sp/savepoint-1"
    assert [f for f in options._flags if "savepoint_path" in f] == ["--savepoint_path=file:/sp/savepoint-1"]
    resumed = stream_accounting.begin(config, "file:/sp/savepoint-1", "stream-c")
    assert resumed.carried == {"decided": 13, "released": 11, "dead_lettered": 2, "duplicate": 1, "reread": 1}
    assert stream_accounting.resumable(config.state) is None  # spent: a later run starts no second resume


def test_a_savepoint_that_fails_leaves_the_job_running_for_the_rerun(tmp_path, monkeypatch) -> None:
    config, steps = _config(tmp_path), []
    lineage = Lineage({0: 3}, live="stream-b")
    lineage.save(config.state)

    def refused(rest: str, jid: str, timeout_s: float) -> str:
        raise RuntimeError("no savepoint of Flink job jid-1 within 180 s: Not all required tasks are running")

    monkeypatch.setattr(stream_orphan, "stop_with_savepoint", refused)
    err = stream_orphan.keep_lost_job(config, lineage, _agent(steps), LOST)
    assert err.exit_code == ExitCode.RUNNER_LOST and steps == []
    assert "could not be stopped into a savepoint" in str(err) and "it is still running" in str(err)
    assert "cancel" not in str(err) and "run the same command again" in str(err)
    # the lineage still names this run as live: the rerun that stops the job carries its part (``adopt``)
    assert stream_accounting.resumable(config.state) is None and stream_accounting._load(config.state).live == \
        "stream-b"


@pytest.mark.parametrize("jobs", [[], [{"jid": "jid-9"}]])
def test_a_job_not_found_yet_is_looked_up_by_name(tmp_path, monkeypatch, jobs) -> None:
    config = _config(tmp_path)
    lineage = Lineage({0: 3}, live="stream-b")
    monkeypatch.setattr(stream_orphan, "live_jobs", lambda rest, name: jobs)
    monkeypatch.setattr(stream_orphan, "stop_with_savepoint", lambda rest, jid, timeout_s: f"file:/sp/{jid}")
    lost = stream_orphan.JobServerLostError(REST, "esa-stream-abc", None, "127.0.0.1:2", "Socket closed")
    err = stream_orphan.keep_lost_job(config, lineage, _agent([]), lost)
    assert ("stopped into savepoint file:/sp/jid-9;" in str(err)) == bool(jobs)
    assert bool(jobs) or "is not running on" in str(err)


# ---------------------------------------------------------------- a driver killed while its job is being stopped

def _options(*extra: str) -> PipelineOptions:
    return PipelineOptions(["--runner=FlinkRunner", f"--flink_master={REST}", *extra])


def _killed_while_stopping(config, monkeypatch) -> None:
    """keep_lost_job asks for the savepoint and is interrupted while it waits (SIGTERM's KeyboardInterrupt
    here; a SIGKILL leaves the same files): the lineage says which job was being stopped."""
    Lineage({0: 3}, live="stream-b").save(config.state)

    def interrupted(rest: str, jid: str, timeout_s: float) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(stream_orphan, "stop_with_savepoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stream_orphan.keep_lost_job(config, stream_accounting._load(config.state), _agent([]), LOST)
    assert stream_accounting.stopping(config.state) == "jid-1"
    monkeypatch.setattr(stream_orphan, "live_jobs", lambda rest, name: [])  # the stop went through: FINISHED


def test_the_rerun_finds_the_savepoint_a_killed_driver_was_waiting_for(tmp_path, monkeypatch, caplog) -> None:
    config = _config(tmp_path)
    _killed_while_stopping(config, monkeypatch)
    asked = []
    monkeypatch.setattr(stream_orphan, "job_savepoint",
                        lambda rest, jid: asked.append(jid) or ("FINISHED", "file:/sp/savepoint-jid-1x-ab"))
    options = _options()
    ledger = ReleaseLedger(config.state_layout.ledger)
    assert stream_orphan.resume_orphan(config, ledger, options) == "file:/sp/savepoint-jid-1x-ab"
    assert asked == ["jid-1"] and "was killed while its Flink job jid-1 was being stopped" in caplog.text
    assert [f for f in options._flags if "savepoint_path" in f] == ["--savepoint_path=file:/sp/savepoint-jid-1x-ab"]
    resumed = stream_accounting.begin(config, "file:/sp/savepoint-jid-1x-ab", "stream-c")
    assert resumed.live == "stream-c" and resumed.stopping is None  # the dead run's part carried by ``adopt``
    assert stream_orphan.resume_orphan(config, ledger, _options()) is None  # spent: asked no more


def test_a_stopped_job_that_ended_without_a_savepoint_starts_a_new_lineage(tmp_path, monkeypatch, caplog) -> None:
    config = _config(tmp_path)
    _killed_while_stopping(config, monkeypatch)
    monkeypatch.setattr(stream_orphan, "job_savepoint", lambda rest, jid: ("CANCELED", None))
    assert stream_orphan.resume_orphan(config, ReleaseLedger(config.state_layout.ledger), _options()) is None
    assert "ended CANCELED without one: the windows it held open are lost" in caplog.text
    assert stream_accounting.stopping(config.state) is None


def test_a_job_the_cluster_forgot_needs_its_savepoint_named(tmp_path, monkeypatch) -> None:
    config = _config(tmp_path)
    _killed_while_stopping(config, monkeypatch)
    monkeypatch.setattr(stream_orphan, "job_savepoint", lambda rest, jid: ("UNKNOWN", None))
    ledger = ReleaseLedger(config.state_layout.ledger)
    for options in (_options(), _options("--savepoint_path=file:/sp/savepoint-other-0a")):
        with pytest.raises(RunnerLostError, match=r"no longer knows that job: run again with --savepoint_path <its "
                                                  r"savepoint: savepoint-jid-1-\.\.\. .*or remove .*stream_lineage"):
            stream_orphan.resume_orphan(config, ledger, options)
    named = _options("--savepoint_path=file:/sp/savepoint-jid-1-0a1b/")
    assert stream_orphan.resume_orphan(config, ledger, named) == "file:/sp/savepoint-jid-1-0a1b/"
    stream_accounting.begin(config, "file:/sp/savepoint-jid-1-0a1b/", "stream-c")


def test_a_failed_stop_leaves_no_mark(tmp_path, monkeypatch) -> None:
    config = _config(tmp_path)
    Lineage({0: 3}, live="stream-b").save(config.state)

    def refused(rest: str, jid: str, timeout_s: float) -> str:
        raise RuntimeError("no savepoint of Flink job jid-1 within 180 s")

    monkeypatch.setattr(stream_orphan, "stop_with_savepoint", refused)
    stream_orphan.keep_lost_job(config, stream_accounting._load(config.state), _agent([]), LOST)
    assert stream_accounting._load(config.state).stopping is None  # the job runs on: the orphan path stops it


def test_a_stop_answered_by_an_earlier_requests_savepoint(monkeypatch) -> None:
    """A rerun that asks to stop a job whose killed driver's stop is still in flight: Flink refuses the second
    request once the job has ended; the savepoint the first one took is the answer."""
    calls = []

    def rest(rest: str, path: str, body: dict | None = None, timeout_s: float = 30.0) -> dict:
        calls.append(path)
        if path.endswith("/stop"):
            raise urllib.error.HTTPError(f"http://{rest}{path}", 409, "Conflict", None, None)  # type: ignore[arg-type]
        return {"state": "FINISHED"} if path == "/jobs/jid-1" else \
            {"latest": {"savepoint": {"external_path": "file:/sp/savepoint-jid-1-aa"}}}

    monkeypatch.setattr(flink_drain, "_call", rest)
    assert flink_drain.stop_with_savepoint(REST, "jid-1", 30.0) == "file:/sp/savepoint-jid-1-aa"
    assert calls == ["/jobs/jid-1/stop", "/jobs/jid-1", "/jobs/jid-1/checkpoints"]
    monkeypatch.setattr(flink_drain, "job_savepoint", lambda rest, jid: ("CANCELED", None))
    with pytest.raises(RuntimeError, match="Flink job jid-1 ended CANCELED without a savepoint: HTTP 409"):
        flink_drain.stop_with_savepoint(REST, "jid-1", 30.0)


# ---------------------------------------------------------------- a drain the driver asked, then lost

def _draining(config, monkeypatch, states: list[str], asked: list[int]) -> None:
    """A job that reports ``states`` one look after another; ``drain_job`` counts the drains asked."""
    Path(stream_orphan.stream_root(config)).mkdir(parents=True)
    (Path(stream_orphan.stream_root(config)) / "STOP").write_bytes(b"stop\n")  # the stop file: a drain asked
    looks = iter(states)
    monkeypatch.setattr(stream_orphan, "job_savepoint", lambda rest, jid: (next(looks), "file:/sp/savepoint-drain"))
    monkeypatch.setattr(stream_orphan, "drain_job", lambda rest, jid: asked.append(1))
    monkeypatch.setattr(time, "sleep", lambda s: None)


def test_an_orphan_that_was_draining_finishes_its_drain_and_is_never_resumed(tmp_path, monkeypatch) -> None:
    """Its driver was stopped (SIGTERM: the drain asked) and then killed (a grace period's SIGKILL): the drain's
    final savepoint has every window fired and the read ended, so resuming from it would read nothing more."""
    config, asked = _config(tmp_path), []
    config.staging_location = None
    _draining(config, monkeypatch, ["RUNNING", "RUNNING", "FINISHED"], asked)
    monkeypatch.setattr(stream_orphan, "live_jobs", lambda rest, name: [{"jid": "jid-7"}])
    monkeypatch.setattr(stream_orphan, "stop_with_savepoint", lambda *a, **k: pytest.fail("stopped, not drained"))
    ledger = ReleaseLedger(config.state_layout.ledger)
    assert stream_orphan.drain_asked(config)
    assert stream_orphan.resume_orphan(config, ledger, _options()) is None  # a new lineage, nothing resumed
    assert asked == [1]  # asked once (again, in case it had been refused), not every second


@pytest.mark.parametrize("state", ["CANCELED", "UNKNOWN"])
def test_a_drain_that_ends_otherwise_says_so(tmp_path, monkeypatch, state) -> None:
    config = _config(tmp_path)
    config.staging_location = None
    _draining(config, monkeypatch, ["RUNNING", state], [])
    with pytest.raises(RunnerLostError, match=rf"the draining Flink job jid-1 on {REST} ended {state}, not FINISHED"):
        stream_orphan.finish_drain(REST, "jid-1", lambda: None)


def test_a_job_server_lost_mid_drain_waits_for_the_drain_then_seals(tmp_path, monkeypatch) -> None:
    config, steps, asked = _config(tmp_path), [], []
    config.staging_location = None
    _draining(config, monkeypatch, ["RUNNING", "FINISHED"], [])
    stream_orphan.finish_lost_drain(LOST, _agent(steps), lambda: asked.append(1))
    assert steps == [1] and asked == [1]
    lost = stream_orphan.JobServerLostError(REST, "esa-stream-abc", None, "127.0.0.1:2", "Socket closed")
    with pytest.raises(RunnerLostError, match="was never found"):
        stream_orphan.finish_lost_drain(lost, _agent(steps), lambda: None)
