"""The driver- and job-server-kill test of a bounded job on the Flink cluster (``kill_driver_then_job_server``)
and its helpers: an esa driver started as its own process group (as a shell or an orchestrator starts it), the
processes of that group, the cluster's jobs by name (``/jobs/overview``), the SDK harnesses its TaskManagers
started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from pipelines.flink_cluster import LocalFlinkCluster
from transforms.state.ledger import ReleaseLedger

TERMINAL = {"FINISHED", "FAILED", "CANCELED"}


def start_driver(env: Path, *args: str) -> subprocess.Popen[str]:
    """``<env>/bin/esa ARGS`` as the leader of a new process group (its job server watchdog and JVM join it)."""
    child = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.Popen([str(env / "bin" / "esa"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child, start_new_session=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def group(pgid: int) -> dict[int, str]:
    """The live processes of a process group, with their command lines (zombies excluded)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and (cmd := _cmdline(int(entry.name))):
                    found[int(entry.name)] = cmd
            except OSError:
                continue
    return found


def job_server_jvm(pgid: int) -> int:
    (pid,) = [pid for pid, cmd in group(pgid).items() if "LoopbackFlinkJobServer" in cmd]
    return pid


def wait_gone(pids: list[int], timeout_s: float = 60) -> list[int]:
    """Wait until none of ``pids`` is alive; those still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [p for p in alive if _cmdline(p)]
    return alive


def jobs_named(cluster: LocalFlinkCluster, prefix: str) -> dict[str, dict]:
    return {j["jid"]: j for j in cluster.get("/jobs/overview")["jobs"] if j["name"].startswith(prefix)}


def wait_running(cluster: LocalFlinkCluster, prefix: str, driver: subprocess.Popen[str], known: set[str],
                 timeout_s: float = 1200) -> dict:
    """The first job named ``prefix...`` not in ``known`` once it is RUNNING (AssertionError if the driver
    exits first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for jid, found in jobs_named(cluster, prefix).items():
            if jid not in known and found["state"] == "RUNNING":
                return found
        if driver.poll() is not None:
            _, err = driver.communicate()
            raise AssertionError(f"the driver exited {driver.returncode} before its job ran: {err[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no new job {prefix}... RUNNING within {timeout_s:.0f} s")


def state_of(cluster: LocalFlinkCluster, jid: str) -> str:
    """A job's state from ``/jobs/overview``, which asks the JobManager each time (``/jobs/<id>`` answers from a
    cache refreshed every ``web.refresh-interval``, 3 s: a job cancelled a moment ago can still read RUNNING)."""
    return {j["jid"]: j["state"] for j in cluster.get("/jobs/overview")["jobs"]}[jid]


def harnesses(cluster: LocalFlinkCluster) -> list[int]:
    """SDK harness processes (PROCESS environment) the cluster's TaskManagers started and that still run."""
    managers = {pid for name, pid in cluster.pids().items() if name.startswith("taskmanager")}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            cmd = _cmdline(int(entry.name))
            if int(stat.rsplit(")", 1)[1].split()[1]) in managers and ("sdk_worker" in cmd or "sdk-harness" in cmd):
                found.append(int(entry.name))
    return found


def kill_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGKILL)


def no_harness_left(cluster: LocalFlinkCluster, timeout_s: float = 120) -> list[int]:
    """The harnesses still running after ``timeout_s`` (a TaskManager stops them when the job's tasks end)."""
    deadline = time.monotonic() + timeout_s
    while (left := harnesses(cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def kill_driver_then_job_server(cluster: LocalFlinkCluster, env: Path, stage_dir: Path, command: list[str]) -> dict:
    """Two attempts of a bounded esa job (``command``: its stage and flags, starting its own job server) killed
    mid-run, each once its Flink job is RUNNING:

    1. SIGKILL of the driver's whole process group (driver, job server watchdog, JVM): all three are gone, the
       Flink job is left behind (measured: still RUNNING);
    2. the rerun: it cancels that orphan before it submits (unless it finished by itself meanwhile), then
       SIGKILL of only its job server JVM: the driver fails in one line, exit 10, its own job CANCELED.

    Nothing is sealed by either. What the caller's next run of the command must do is finish to the undisturbed
    result. Returns the Flink job name, the two jobs' ids and what became of the orphan."""
    stage = command[0]
    prefix = f"esa-{stage}-"
    known = set(jobs_named(cluster, prefix))
    driver = start_driver(env, *command)
    orphan = wait_running(cluster, prefix, driver, known)
    name = f"{prefix}{(stage_dir / 'flink-job.id').read_text().strip()}"
    assert orphan["name"] == name  # named after its state directory: how a rerun finds it
    members = group(driver.pid)
    assert len(members) == 3 and job_server_jvm(driver.pid) in members, members  # driver, watchdog, JVM
    kill_group(driver.pid)
    driver.wait()
    assert wait_gone(list(members)) == []
    after_kill = state_of(cluster, orphan["jid"])

    driver = start_driver(env, *command)
    second = wait_running(cluster, prefix, driver, known | {orphan["jid"]})
    assert second["name"] == name
    orphan_end = state_of(cluster, orphan["jid"])
    assert orphan_end in {"CANCELED", "FINISHED"}  # gone before the rerun submitted: cancelled, or done by itself
    members = group(driver.pid)
    os.kill(job_server_jvm(driver.pid), signal.SIGKILL)
    _, err = driver.communicate(timeout=900)
    lines = err.strip().splitlines()
    assert driver.returncode == 10, err[-4000:]
    assert "Traceback" not in err and lines[-1].startswith(f"esa {stage}: error: the Flink job server"), err[-4000:]
    assert "went away mid-run" in lines[-1] and f"its Flink job {name}" in lines[-1] and "was cancelled" in lines[-1]
    assert orphan_end == "FINISHED" or f"cancelled 1 Flink job(s) an earlier driver of {stage_dir}" in err, err
    assert state_of(cluster, second["jid"]) == "CANCELED"  # by its driver, on the way out
    assert wait_gone(list(members)) == []
    assert list(ReleaseLedger(stage_dir / "ledger").entries()) == []  # nothing sealed by either attempt
    return {"name": name, "orphan": orphan["jid"], "after_kill": after_kill, "orphan_end": orphan_end,
            "second": second["jid"]}
