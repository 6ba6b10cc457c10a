"""A streaming shuffler's driver killed mid-run, and the same command run again (``pipelines.stream_orphan``): the
driver (``esa shuffle --kafka_io sdf --streaming``, Beam 2.62.0 environment, PROCESS harnesses, checkpoints
every 2 s, no idle time-out, so the last window stays open) reads every report, then its whole process group is
killed with SIGKILL; its Flink job is left RUNNING with a window open in its state. The rerun finds that job by
the state directory's name, stops it into a savepoint, resumes from it and is stopped with a drain. The
releases must be the bounded ``--drain`` shuffler's, byte for byte, each window once, and the accounting of
the lineage (the dead run's part carried from its ledger entries and dead-letter counts) must balance.

Between the two, a job server killed under a live driver (``pipelines.stream_shuffle``, runner lost): the rerun
is first started without ``--job_endpoint`` (its own job server, not the session's), and once it has resumed the
orphan, its job server JVM alone is SIGKILLed. The driver must stop its job into a savepoint (never cancel it:
the open windows would be lost) and exit 10 in one line; the command run again resumes from that savepoint.
That run is asked to suspend (SIGUSR1) and SIGKILLed while Flink takes the savepoint, before its driver recorded
where: the final run must find that savepoint on the cluster (the lineage names the job being stopped) and
resume from it, rather than start afresh without the open window. The final run, with its own job server, is
stopped (SIGTERM: a drain) and its job server JVM SIGKILLed while the job drains: the driver must wait for the
drain without it, seal the windows it fired and exit 0 with the lineage balanced.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines.flink_cluster import LocalFlinkCluster
from pipelines.flink_drain import job_savepoint
from tests.e2e.chain_harness import ledger_entries, topic_records
from tests.flink.kills import group, job_server_jvm, no_harness_left, wait_gone
from tests.flink.stream_chain import (
    RUN_S,
    SUBMIT_S,
    committed,
    flink_jobs,
    reference,
    running_job,
    same_releases,
    settled,
    stream_argv,
    twin,
    wait,
)

pytestmark = pytest.mark.slow
N = 150  # clients per window
OPEN = ["--idle_timeout_seconds", "3600"]  # the last window stays open until the drain: no idle clock closes it


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    """The driver as the leader of its own process group (as a shell or an orchestrator starts it)."""
    child = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.Popen(argv, env=child, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            start_new_session=True)


def test_a_killed_streaming_drivers_job_is_stopped_into_a_savepoint_and_resumed_by_the_rerun(
        broker, flink_cluster: LocalFlinkCluster, flink_env: Path, harness_options: list[str], job_server,
        tmp_path: Path) -> None:
    started = time.monotonic()
    bounded, _ = reference(broker.bootstrap, tmp_path / "orphan", N)
    stream = twin(bounded, tmp_path / "stream")
    argv = stream_argv(flink_env, stream, job_server.endpoint, flink_cluster, harness_options, *OPEN)
    before = set(flink_jobs(flink_cluster))
    log = tmp_path / "killed.log"
    proc = _start(argv, log)
    try:
        orphan = running_job(flink_cluster, before, SUBMIT_S, proc, log)
        everything = topic_records(bounded.bootstrap, bounded.reports)
        took = wait(lambda: committed(stream) >= everything, "every report committed", RUN_S, proc, log)
        released_before = len(settled(stream))
        os.killpg(proc.pid, signal.SIGKILL)  # the driver's whole process group; the last window open
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = time.monotonic()
    print(f"killed {killed_at - started:.0f} s after the start, {took:.0f} s after the job ran; "
          f"{released_before} window(s) released before the kill")
    assert released_before < 2  # a window was open in the job's state
    assert flink_jobs(flink_cluster)[orphan] == "RUNNING"  # the orphan outlived its driver

    resumed, kept = _lose_the_job_server(argv, flink_cluster, tmp_path, before, orphan)
    stopped, savepoint = _kill_while_suspending(argv, flink_cluster, stream, tmp_path, before | {orphan, resumed},
                                                kept)

    log2 = tmp_path / "rerun.log"
    proc = _start([a for a in argv if not a.startswith("--job_endpoint")], log2)  # its own job server
    try:
        final = running_job(flink_cluster, before | {orphan, resumed, stopped}, SUBMIT_S, proc, log2)
        restored = flink_cluster.get(f"/jobs/{final}/checkpoints")["latest"]["restored"]
        assert restored and restored["is_savepoint"] and "savepoint" in restored["external_path"]
        members = group(proc.pid)
        proc.send_signal(signal.SIGTERM)  # the drain: the open window fires and is released ...
        wait(lambda: _savepoint_under_way(flink_cluster, final), "the drain under way", RUN_S, proc, log2,
             every_s=0.2)
        os.kill(job_server_jvm(proc.pid), signal.SIGKILL)  # ... without the job server, killed meanwhile
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log2.read_text()
    assert proc.returncode == 0, text[-4000:]
    found = [line for line in text.splitlines() if "was killed while its Flink job" in line]
    assert restored["external_path"] == savepoint and len(found) == 1 and savepoint in found[0], text[-4000:]
    assert "went away while the job drained" in text and "Traceback" not in text, text[-4000:]
    assert wait_gone(list(members)) == [] and flink_jobs(flink_cluster)[final] == "FINISHED"
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    print(f"rerun, resumed and drained in {time.monotonic() - killed_at:.0f} s: {json.dumps(summary)[:700]}")
    assert summary["balanced"] is True and summary["accounting"]["held"] == 0, summary
    assert len(ledger_entries(bounded, "shuffle")) == 2
    same_releases(stream, bounded)  # byte-identical releases, each window once, the same estimates
    print(f"orphan check: {time.monotonic() - started:.0f} s, load {Path('/proc/loadavg').read_text().strip()}")


def _lose_the_job_server(argv: list[str], cluster: LocalFlinkCluster, tmp_path: Path, before: set[str],
                         orphan: str) -> tuple[str, str | None]:
    """The rerun with its own job server (no ``--job_endpoint``): it stops the orphan into a savepoint and
    resumes it; then its job server JVM alone is SIGKILLed, the driver living on. The resumed job's id, and the
    savepoint the driver says it stopped that job into (None if it says the job is still running)."""
    own = [a for a in argv if not a.startswith("--job_endpoint")]
    log = tmp_path / "job-server-lost.log"
    proc = _start(own, log)
    try:
        resumed = running_job(cluster, before | {orphan}, SUBMIT_S, proc, log)
        assert flink_jobs(cluster)[orphan] == "FINISHED"  # the orphan stopped into a savepoint, not cancelled
        restored = cluster.get(f"/jobs/{resumed}/checkpoints")["latest"]["restored"]
        assert restored and restored["is_savepoint"] and "savepoint" in restored["external_path"]
        members = group(proc.pid)
        assert len(members) == 3, members  # driver, job server watchdog, JVM
        os.kill(job_server_jvm(proc.pid), signal.SIGKILL)  # the job server alone; the driver lives
        lost_at = time.monotonic()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    lines = text.strip().splitlines()
    state = flink_jobs(cluster)[resumed]
    print(f"job server SIGKILLed: driver exit {proc.returncode} {time.monotonic() - lost_at:.0f} s later, "
          f"job {state}; last line: {lines[-1] if lines else ''}")
    assert proc.returncode == 10, text[-4000:]
    assert "Traceback" not in text and lines[-1].startswith("esa shuffle: error: the Flink job server"), text[-4000:]
    assert "run the same command again" in lines[-1] and "cancel" not in lines[-1], lines[-1]
    adopted = [line for line in lines if "of a dead driver of" in line]
    assert len(adopted) == 1 and restored["external_path"] in adopted[0], text[-4000:]  # it resumed the orphan
    assert wait_gone(list(members)) == []  # no JVM, watchdog or driver of it left
    if "stopped into savepoint" in lines[-1]:
        assert state == "FINISHED", state  # stopped with a savepoint, not cancelled
        assert no_harness_left(cluster) == []
        return resumed, lines[-1].split("stopped into savepoint ", 1)[1].split(";", 1)[0]
    assert "still running" in lines[-1] and state == "RUNNING", (state, lines[-1])
    return resumed, None


def _kill_while_suspending(argv: list[str], cluster: LocalFlinkCluster, stream: Any, tmp_path: Path,
                           known: set[str], kept: str | None) -> tuple[str, str]:
    """The same command resumes (from the savepoint its driver kept, or stopping the job left running), is
    asked to suspend (SIGUSR1) and is SIGKILLed while Flink takes the savepoint, before the driver recorded it:
    only the cluster knows where the open windows went. The job's id and that savepoint."""
    log = tmp_path / "killed-suspending.log"
    lineage = stream.state("shuffle") / "stream_lineage.json"
    proc = _start(argv, log)
    try:
        jid = running_job(cluster, known, SUBMIT_S, proc, log)
        text = log.read_text()
        adopted = [line for line in text.splitlines() if "of a dead driver of" in line]
        if kept is not None:  # resumed from the savepoint its driver stopped the job into, with nothing to adopt
            assert cluster.get(f"/jobs/{jid}/checkpoints")["latest"]["restored"]["external_path"] == kept, text
            assert not adopted, text[-4000:]
        else:  # the job was left running: this run stopped it into a savepoint and resumed it
            assert len(adopted) == 1, text[-4000:]
        os.kill(proc.pid, signal.SIGUSR1)
        wait(lambda: json.loads(lineage.read_text()).get("stopping") == jid, "the stop marked", RUN_S, proc, log,
             every_s=0.05)
        wait(lambda: _savepoint_under_way(cluster, jid), "the savepoint under way", RUN_S, proc, log, every_s=0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = json.loads(lineage.read_text())
    assert left["stopping"] == jid and left["savepoint"] is None, left  # killed before it recorded the savepoint
    deadline = time.monotonic() + RUN_S
    while flink_jobs(cluster)[jid] != "FINISHED":
        assert time.monotonic() < deadline and flink_jobs(cluster)[jid] == "RUNNING", flink_jobs(cluster)[jid]
        time.sleep(1)
    state, savepoint = job_savepoint(cluster.rest, jid)  # as the next run asks the cluster
    assert state == "FINISHED" and savepoint, (state, cluster.get(f"/jobs/{jid}/checkpoints"))
    print(f"driver SIGKILLed while suspending: job {jid} FINISHED into {savepoint}")
    return jid, savepoint


def _savepoint_under_way(cluster: LocalFlinkCluster, jid: str) -> bool:
    """Flink is taking (or took) a savepoint of ``jid``: the stop was asked (one refused while tasks restore
    is FAILED, and the driver asks again)."""
    history = cluster.get(f"/jobs/{jid}/checkpoints").get("history") or []
    return any(h.get("is_savepoint") and h.get("status") in {"IN_PROGRESS", "COMPLETED"} for h in history) or \
        flink_jobs(cluster)[jid] == "FINISHED"
