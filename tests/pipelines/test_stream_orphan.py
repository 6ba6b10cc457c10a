"""A streaming driver whose job server dies under it (``pipelines.stream_orphan.keep_lost_job``), the cluster's
REST API stubbed: its job is stopped into a savepoint (never cancelled), its run's accounting carried and the
lineage marked so that the same command run again resumes from that savepoint unasked; a savepoint that fails
leaves the job running and says so. The cluster itself is in tests/flink/test_orphan_stream.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import stream_accounting, stream_orphan
from pipelines.exit_codes import ExitCode
from pipelines.stream_accounting import Lineage
from transforms.state.layout import StateDir

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
