"""The project's local Flink session cluster (``deploy/flink/local-cluster``): what it starts, that a real job
runs on it to FINISHED, and that its failure settings hold: a TaskManager killed with SIGKILL mid-job is
noticed, the job restarts from its last checkpoint on the TaskManagers left and, with an exactly-once sink,
writes every number exactly once, as its undisturbed twin does; a job stopped with a savepoint resumes from it
after the whole cluster was stopped and started again, and again writes every number once. (These test the
cluster and its config with a plain Flink job; Beam's jobs on it are in ``test_beam_on_flink.py``.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pipelines.flink_cluster import LocalFlinkCluster
from tests.flink.cluster import (
    completed_checkpoints,
    job,
    stop_with_savepoint,
    submit,
    submit_from_savepoint,
    upload,
    wait_state,
    written_numbers,
)
from tests.flink.conftest import run_script

pytestmark = pytest.mark.slow
N = 40_000


def test_the_cluster_is_one_jobmanager_and_two_taskmanagers_under_its_directory(flink_cluster, flink_dir) -> None:
    overview = flink_cluster.overview()
    assert (overview["taskmanagers"], overview["slots-total"], overview["flink-version"]) == (2, 4, "1.19.3")
    pids = flink_cluster.pids()
    assert set(pids) == {"jobmanager", "taskmanager-1", "taskmanager-2"}
    assert all(flink_cluster.owns(pid) for pid in pids.values())
    config = (flink_dir / "conf" / "config.yaml").read_text()
    assert f"state.checkpoints.dir: {(flink_dir / 'checkpoints').as_uri()}" in config
    assert f"state.savepoints.dir: {(flink_dir / 'savepoints').as_uri()}" in config
    assert "rest.bind-address: 127.0.0.1" in config  # loopback only
    for name in pids:
        assert (flink_dir / "log" / f"{name}.log").stat().st_size > 0
    again = run_script("start", str(flink_dir), "--rest-port", "0")
    assert again.returncode == 1 and "still running" in again.stderr  # one cluster per directory


def test_a_job_runs_to_finished_and_is_listed_in_the_rest_overview(flink_cluster, probe_jar, tmp_path) -> None:
    jar_id = upload(flink_cluster, probe_jar)
    job_id = submit(flink_cluster, jar_id, [str(N), str(tmp_path / "out"), "0"])
    details = wait_state(flink_cluster, job_id, {"FINISHED", "FAILED", "CANCELED"}, timeout_s=120)
    assert details["state"] == "FINISHED"
    listed = {j["jid"]: j["state"] for j in flink_cluster.get("/jobs/overview")["jobs"]}
    assert listed[job_id] == "FINISHED"
    assert sorted(written_numbers(tmp_path / "out")) == list(range(1, N + 1))


def test_a_taskmanager_killed_mid_job_restarts_from_a_checkpoint_and_writes_each_number_once(
        flink_cluster: LocalFlinkCluster, probe_jar: Path, tmp_path: Path) -> None:
    jar_id = upload(flink_cluster, probe_jar)
    # ~40 pauses of 250 ms per subtask: about 10 s of work, checkpoints every 300 ms.
    job_id = submit(flink_cluster, jar_id, [str(N * 2), str(tmp_path / "out"), "250"])
    wait_state(flink_cluster, job_id, {"RUNNING"}, timeout_s=60)
    deadline = time.monotonic() + 60
    while completed_checkpoints(flink_cluster, job_id) < 2:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.2)
    # The job's two subtasks are spread over both TaskManagers (one slot busy on each): the victim runs one.
    busy = [tm["slotsNumber"] - tm["freeSlots"] for tm in flink_cluster.get("/taskmanagers")["taskmanagers"]]
    assert busy == [1, 1], busy
    victim = flink_cluster.pids()["taskmanager-2"]
    os.kill(victim, signal.SIGKILL)
    try:
        details = wait_state(flink_cluster, job_id, {"FINISHED", "FAILED", "CANCELED"}, timeout_s=180)
        assert details["state"] == "FINISHED", details
        exceptions = flink_cluster.get(f"/jobs/{job_id}/exceptions")
        assert exceptions["exceptionHistory"]["entries"], "the job never saw the TaskManager die"
        numbers = written_numbers(tmp_path / "out")
        assert len(numbers) == N * 2 and sorted(numbers) == list(range(1, N * 2 + 1))  # once each
        assert job(flink_cluster, job_id)["state"] == "FINISHED"
    finally:
        flink_cluster.start_taskmanager(2)  # the session cluster is whole again for the tests after this one
        flink_cluster.wait_ready(2, timeout_s=60)


def test_stop_with_savepoint_then_a_cluster_restart_then_resume_writes_each_number_once(
        flink_cluster: LocalFlinkCluster, flink_dir: Path, probe_jar: Path, tmp_path: Path) -> None:
    args = [str(N * 2), str(tmp_path / "out"), "250"]
    job_id = submit(flink_cluster, upload(flink_cluster, probe_jar), args)
    wait_state(flink_cluster, job_id, {"RUNNING"}, timeout_s=60)
    deadline = time.monotonic() + 60
    while completed_checkpoints(flink_cluster, job_id) < 1:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.2)
    savepoint = stop_with_savepoint(flink_cluster, job_id)
    assert savepoint.startswith(f"file:{flink_dir / 'savepoints'}/")  # under the cluster's directory
    assert wait_state(flink_cluster, job_id, {"FINISHED", "FAILED", "CANCELED"})["state"] == "FINISHED"
    # Stopped mid-job: what was written so far sits in in-progress files that the savepoint holds.
    in_progress = [int(x) for f in (tmp_path / "out").rglob(".part-*") for x in f.read_text().split()]
    assert 0 < len(in_progress) < N * 2
    # The whole cluster stopped and started again from its directory: the savepoint outlives it.
    assert run_script("stop", str(flink_dir), timeout=120).returncode == 0
    restarted = run_script("start", str(flink_dir), "--rest-port", "0", "--slots", "2")
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert restarted.stdout.splitlines()[-1] == flink_cluster.rest
    resumed = submit_from_savepoint(flink_cluster, upload(flink_cluster, probe_jar), args, savepoint)
    assert wait_state(flink_cluster, resumed, {"FINISHED", "FAILED", "CANCELED"}, timeout_s=180)["state"] == \
        "FINISHED"
    restored = flink_cluster.get(f"/jobs/{resumed}/checkpoints")["latest"]["restored"]
    assert restored and restored["external_path"] == savepoint  # it resumed, it did not start over
    numbers = written_numbers(tmp_path / "out")
    assert len(numbers) == N * 2 and sorted(numbers) == list(range(1, N * 2 + 1))  # once each, none lost


def test_stop_terminates_every_process_by_its_pid(tmp_path: Path) -> None:
    started = run_script("start", str(tmp_path / "c"), "--rest-port", "0", "--taskmanagers", "1")
    assert started.returncode == 0, started.stderr[-2000:]
    cluster = LocalFlinkCluster(tmp_path / "c")
    assert started.stdout.splitlines()[-1] == cluster.rest and cluster.overview()["taskmanagers"] == 1
    pids = cluster.pids()
    stopped = run_script("stop", str(tmp_path / "c"), timeout=120)
    assert stopped.returncode == 0
    assert stopped.stdout.split() == ["taskmanager-1:", "terminated", "jobmanager:", "terminated"]
    assert not any(Path(f"/proc/{pid}").exists() and cluster.owns(pid) for pid in pids.values())


def test_a_cluster_that_cannot_start_says_why_in_one_line_and_leaves_no_process(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = run_script("start", str(tmp_path / "c"), "--rest-port", str(port))
    assert failed.returncode == 1 and failed.stdout == ""
    assert len(failed.stderr.strip().splitlines()) == 1 and "BindException" in failed.stderr, failed.stderr
    cluster = LocalFlinkCluster(tmp_path / "c")
    assert cluster.pids() == {}
    lingering = [p for p in Path("/proc").iterdir() if p.name.isdigit() and cluster.owns(int(p.name))]
    assert lingering == []  # the TaskManagers started before the JobManager failed were stopped
