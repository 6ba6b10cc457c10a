"""A streaming shuffler's driver killed mid-run, and the same command run again (``pipelines.stream_orphan``): the
driver (``esa shuffle --kafka_io sdf --streaming``, Beam 2.62.0 environment, PROCESS harnesses, checkpoints
every 2 s, no idle time-out, so the last window stays open) reads every report, then its whole process group is
killed with SIGKILL; its Flink job is left RUNNING with a window open in its state. The rerun finds that job by
the state directory's name, stops it into a savepoint, resumes from it and is stopped with a drain. The
releases must be the bounded ``--drain`` shuffler's, byte for byte, each window once, and the accounting of
the lineage (the dead run's part carried from its ledger entries and dead-letter counts) must balance.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipelines.flink_cluster import LocalFlinkCluster
from tests.e2e.chain_harness import ledger_entries, topic_records
from tests.flink.stream_chain import (
    RUN_S,
    SUBMIT_S,
    committed,
    flink_jobs,
    reference,
    running_job,
    same_releases,
    settled,
    stop,
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

    log2 = tmp_path / "rerun.log"
    proc = _start(argv, log2)  # the same command
    try:
        resumed = running_job(flink_cluster, before | {orphan}, SUBMIT_S, proc, log2)
        assert flink_jobs(flink_cluster)[orphan] == "FINISHED"  # stopped into a savepoint, not cancelled
        restored = flink_cluster.get(f"/jobs/{resumed}/checkpoints")["latest"]["restored"]
        assert restored and restored["is_savepoint"] and "savepoint" in restored["external_path"]
        out = stop(proc)  # the drain: the open window fires and is released
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log2.read_text()
    assert proc.returncode == 0, text[-4000:]
    adopted = [line for line in text.splitlines() if "of a dead driver of" in line]
    assert len(adopted) == 1 and restored["external_path"] in adopted[0], text[-4000:]
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    print(f"rerun, resumed and drained in {time.monotonic() - killed_at:.0f} s: {json.dumps(summary)[:700]}")
    assert summary["balanced"] is True and summary["accounting"]["held"] == 0, summary
    assert len(ledger_entries(bounded, "shuffle")) == 2
    same_releases(stream, bounded)  # byte-identical releases, each window once, the same estimates
    print(f"orphan check: {time.monotonic() - started:.0f} s, load {Path('/proc/loadavg').read_text().strip()}")
