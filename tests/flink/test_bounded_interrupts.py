"""SIGINT and SIGTERM of a bounded run's driver on the Flink cluster (``esa shuffle`` without ``--streaming``):
the driver cancels its Flink job on the way out (``pipelines.flink_jobs.owned_flink_job``), so nothing of it is
left RUNNING on the cluster, and stops in one line with ``128 + signal`` (``pipelines.interrupts``); nothing is
sealed, and the rerun of the same command releases what the bounded in-process shuffler released.

Two interrupted attempts, each once its Flink job is RUNNING: Ctrl-C in a terminal (SIGINT to the driver's
whole process group, its own job server's watchdog and JVM included) and an orchestrator's stop (SIGTERM to
the driver alone, through a job server it does not own, ``--job_endpoint``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.chain_harness import ledger_entries
from tests.flink.beam_jobs import esa
from tests.flink.kills import (
    TERMINAL,
    group,
    jobs_named,
    no_harness_left,
    start_driver,
    state_of,
    wait_gone,
    wait_running,
)
from tests.flink.stream_chain import reference, twin

pytestmark = pytest.mark.slow
N = 150  # clients per window (two windows)


def _interrupted(cluster, env: Path, args: list[str], sig: signal.Signals, whole_group: bool) -> float:
    """One attempt stopped by ``sig`` once its job RUNS: exit 128 + sig in one line, its job CANCELED, its
    processes gone. The seconds from the signal to the driver's exit."""
    known = set(jobs_named(cluster, "esa-shuffle-"))
    driver = start_driver(env, *args)
    job = wait_running(cluster, "esa-shuffle-", driver, known)
    members = group(driver.pid)
    signalled = time.monotonic()
    if whole_group:
        os.killpg(driver.pid, sig)
    else:
        driver.send_signal(sig)
    _, err = driver.communicate(timeout=300)
    took = time.monotonic() - signalled
    code = 128 + int(sig)
    lines = err.strip().splitlines()
    assert driver.returncode == code, err[-4000:]
    assert "Traceback" not in err and lines[-1] == f"esa shuffle: interrupted by {sig.name}; stopped (exit {code})", \
        err[-4000:]
    assert f"cancelling Flink job {job['name']} ({job['jid']}, RUNNING)" in err, err[-4000:]
    assert state_of(cluster, job["jid"]) == "CANCELED"  # waited for by the driver, not only asked
    assert wait_gone(list(members)) == []
    print(f"{sig.name}: exit {driver.returncode} {took:.1f} s after the signal; job {job['jid']} CANCELED")
    return took


def test_sigint_and_sigterm_cancel_the_bounded_runs_flink_job_and_the_rerun_matches(
        broker, flink_cluster, flink_env: Path, harness_options: list[str], job_server, tmp_path: Path) -> None:
    started = time.monotonic()
    bounded, _ = reference(broker.bootstrap, tmp_path / "interrupts", N)
    chain = twin(bounded, tmp_path / "cluster")  # the same reports into its own state, group and topic
    args = ["shuffle", "--spec", chain.spec_path, "--kafka_bootstrap", chain.bootstrap, "--output_dir",
            str(chain.out), "--state_dir", str(chain.state("shuffle")), "--keys_dir", str(chain.keys),
            "--raw_topic", chain.raw, "--reports_topic", chain.reports, "--shuffled_topic", chain.shuffled,
            "--consumer_group", f"{chain.group}-shuffle", "--seed", str(chain.seed), "--create_topics", "--drain",
            "--runner", "FlinkRunner", "--flink_master", flink_cluster.rest, "--parallelism", "2",
            *harness_options]
    _interrupted(flink_cluster, flink_env, args, signal.SIGINT, whole_group=True)
    _interrupted(flink_cluster, flink_env, [*args, f"--job_endpoint={job_server.endpoint}"], signal.SIGTERM,
                 whole_group=False)
    assert ledger_entries(chain, "shuffle") == []  # nothing sealed by either attempt

    summary = esa(flink_env, *args, f"--job_endpoint={job_server.endpoint}")
    assert summary["balanced"] is True, summary
    assert [(e.key, e.digest) for e in ledger_entries(chain, "shuffle")] == \
        [(e.key, e.digest) for e in ledger_entries(bounded, "shuffle")]
    name = f"esa-shuffle-{(chain.state('shuffle') / 'flink-job.id').read_text().strip()}"
    assert not [j for j in jobs_named(flink_cluster, name).values() if j["state"] not in TERMINAL]
    assert no_harness_left(flink_cluster) == []
    print(f"bounded interrupts: {time.monotonic() - started:.0f} s, load {Path('/proc/loadavg').read_text().strip()}")
