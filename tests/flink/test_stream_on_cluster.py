"""The streaming shuffler (``esa shuffle --kafka_io sdf --streaming``, Beam 2.62.0 environment) on the local Flink
1.19.3 cluster, PROCESS harnesses, checkpoints every 2 s: one job lineage through every failure an operator meets,
two job submissions (one per cluster incarnation), small data.

1. The driver reads window 1 (an old window) and part of window 2 (the current hour). Checked while the job runs,
   each one of the risks an audit of the graph against Beam's known issues named: the reader's keyed SDF stage
   starts a bundle (else the test fails within ``STALL_S`` naming "the stalled read", docs/deployment.md); the
   first offsets are committed only once a checkpoint completed (beam #26884); the whole topic is committed while
   the job runs (bundle finalization on Flink streaming); window 1 is released while the job runs, from the
   source's watermark (allowed lateness 0: nothing held by a side input), the read's idle clock moving it.
2. A TaskManager is killed with SIGKILL, window 2 open in the job's state: Flink restores the job from a checkpoint.
3. SIGUSR1 suspends the job into a savepoint, window 2 still open in it; the driver exits 0 and the job FINISHED.
4. The whole cluster stops and starts again (another REST port); more reports for window 2 arrive.
5. A second driver resumes from the savepoint (``--savepoint_path``, its own job server for the new address);
   a stop drains it (the job FINISHED, not cancelled, no consumer lag).

The releases must be those of the bounded in-process ``esa shuffle --drain`` over every report, byte for byte,
each window once, with the same estimates, and both drivers' record accounting must balance
(``pipelines.stream_accounting``: after a failover and a restore the runner's counters cover the last attempt only).

Window 2 stays open until the drain however long the test takes: the read's watermark is the newest event time,
or the wall clock once a partition is idle for 5 s, minus an out-of-orderness of 2 h: window 1 (3 to 4 h old)
closes while window 2 (the current hour) cannot before 2 h after its end.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipelines.flink_cluster import LocalFlinkCluster
from tests.e2e.chain_harness import Chain, ledger_entries, new_chain, recent_start, run_inline, topic_records
from tests.flink.cluster import completed_checkpoints
from tests.flink.conftest import run_script
from tests.flink.stream_chain import (
    RUN_S,
    SEED,
    SPEC_TOML,
    SUBMIT_S,
    cancel_left,
    committed,
    flink_jobs,
    read_started,
    reader_starts,
    running_job,
    same_releases,
    settled,
    start,
    stop,
    stream_argv,
    twin,
    wait,
)
from transforms.io.kafka.planning import consumer_lag

pytestmark = pytest.mark.slow
N = 150  # clients in window 1, in window 2 before the suspend, and in window 2 after the resume
HELD_OPEN = ["--out_of_orderness_seconds", "7200"]


def _produce(chain: Chain, spec, n: int, start_ms: int, seed: int, bad: bool, until_ms: int | None = None) -> None:
    """``n`` clients' reports in the window from ``start_ms`` (event times not after ``until_ms``), encoded."""
    from pipelines.demo.population import synthesize
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated

    population = synthesize(spec, n, windows=1, start_ms=start_ms, seed=seed)
    if until_ms is not None:  # the current window: no event time from the future
        population = replace(population, event_times_ms=np.minimum(population.event_times_ms, until_ms))
    enrol_simulated(chain.keys, population.client_ids.tolist())
    produce_population(chain.bootstrap, spec, population, raw_topic=chain.raw, reports_topic=chain.reports,
                       bad_per_kind=1 if bad else 0, seed=seed)
    run_inline(chain, ("encode",))  # the encoder appends to the reports topic, in transactions


def _patient(predicate):
    """``predicate``, False while the JobManager is too busy to answer its REST call in time (a loaded machine
    right after a TaskManager died): asked again at the next poll."""
    def asked() -> bool:
        try:
            return bool(predicate())
        except OSError:
            return False
    return asked


def _restored_and_checkpointing(cluster: LocalFlinkCluster, job_id: str) -> bool:
    """Every task RUNNING again after a restore from a checkpoint, and a checkpoint completed since."""
    details = cluster.get(f"/jobs/{job_id}")
    latest = cluster.get(f"/jobs/{job_id}/checkpoints").get("latest") or {}
    restored, completed = latest.get("restored"), latest.get("completed")
    return (details["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in details["vertices"])
            and restored is not None and completed is not None
            and completed["latest_ack_timestamp"] > restored["restore_timestamp"])


def _summary(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_a_streaming_lineage_through_a_taskmanager_kill_a_savepoint_and_a_cluster_restart_changes_no_release(
        broker, flink_cluster: LocalFlinkCluster, flink_dir: Path, flink_env: Path, harness_options: list[str],
        job_server, tmp_path: Path) -> None:
    from transforms.spec import load_spec

    base = tmp_path / "lineage"
    base.mkdir()
    (base / "flink_stream.toml").write_text(SPEC_TOML)
    spec = load_spec(base / "flink_stream.toml")
    window_ms = spec.window_seconds * 1000
    bounded = new_chain(broker.bootstrap, base, "bounded", spec_path=str(base / "flink_stream.toml"), seed=SEED)
    window_2 = recent_start(window_ms, back=0)  # the current hour
    _produce(bounded, spec, N, recent_start(window_ms, back=4), SEED, bad=True)
    _produce(bounded, spec, N, window_2, SEED + 1, bad=False, until_ms=int(time.time() * 1000))
    stream = twin(bounded, tmp_path / "stream")
    log = tmp_path / "driver.log"
    argv = stream_argv(flink_env, stream, job_server.endpoint, flink_cluster, harness_options, *HELD_OPEN)
    before, started_reads = set(flink_jobs(flink_cluster)), reader_starts(flink_cluster, stream.reports)
    started = time.monotonic()
    proc = start(argv, log)
    mine: list[str] = []
    try:
        job_id = running_job(flink_cluster, before, SUBMIT_S, proc, log)
        mine.append(job_id)
        running_at = time.monotonic()
        first_bundle_s = read_started(flink_cluster, job_id, stream.reports, started_reads, proc, log, tmp_path)
        # Offsets against checkpoints: the first commit comes after a completed checkpoint, never before.
        wait(lambda: committed(stream) > 0, "a first committed offset", RUN_S, proc, log)
        assert completed_checkpoints(flink_cluster, job_id) >= 1
        # Bundle finalization on Flink streaming: the whole topic committed while the job runs.
        first_phase = topic_records(bounded.bootstrap, bounded.reports)
        wait(lambda: committed(stream) >= first_phase, "the first phase committed", RUN_S, proc, log)
        read_s = time.monotonic() - running_at
        # Window 1 fires from the watermark with no stop: nothing is held by a side input.
        released_s = wait(lambda: len(settled(stream)) == 1, "window 1 released while running", RUN_S, proc, log)
        assert flink_jobs(flink_cluster)[job_id] == "RUNNING"
        print(f"job RUNNING {running_at - started:.0f} s after the start; first bundle {first_bundle_s:.0f} s after "
              f"its first checkpoint; {first_phase} records committed {read_s:.0f} s after RUNNING; window 1 released "
              f"{released_s:.0f} s after that")

        killed_at = time.monotonic()
        flink_cluster.kill("taskmanager-2")  # SIGKILL, window 2 open in the job's state
        wait(_patient(lambda: bool(flink_cluster.get(f"/jobs/{job_id}/exceptions")["exceptionHistory"]["entries"])),
             "the job to notice the TaskManager died", RUN_S, proc, log)
        flink_cluster.start_taskmanager(2)
        flink_cluster.wait_ready(2)
        wait(_patient(lambda: _restored_and_checkpointing(flink_cluster, job_id)),
             "the job restored from its checkpoint and checkpointing again", RUN_S, proc, log)
        restored_s = time.monotonic() - killed_at
        proc.send_signal(signal.SIGUSR1)  # suspend: stop the job into a savepoint, window 2 open in it
        out, _ = proc.communicate(timeout=RUN_S)
        assert proc.returncode == 0, log.read_text()[-4000:]
        suspended = _summary(out)
        print(f"restored {restored_s:.0f} s after the kill; suspended at {time.monotonic() - started:.0f} s: "
              f"{json.dumps(suspended)[:600]}")
        savepoint = suspended.get("savepoint")
        assert savepoint, suspended
        assert suspended["accounting"]["held"] > 0  # window 2's sets are in the savepoint, not released
        assert flink_jobs(flink_cluster)[job_id] == "FINISHED"
        assert len(settled(stream)) == 1

        # The whole cluster stopped and started again (another REST port); more reports for window 2 meanwhile.
        assert run_script("stop", str(flink_dir), timeout=120).returncode == 0
        restarted = run_script("start", str(flink_dir), "--rest-port", "0", "--slots", "2")
        assert restarted.returncode == 0, restarted.stderr[-2000:]
        _produce(bounded, spec, N, window_2, SEED + 2, bad=False,
                 until_ms=min(int(time.time() * 1000), window_2 + window_ms - 1))
        resumed_argv = [a for a in stream_argv(flink_env, stream, job_server.endpoint, flink_cluster,
                                               harness_options, *HELD_OPEN, f"--savepoint_path={savepoint}")
                        if not a.startswith("--job_endpoint=")]  # the driver starts a job server for the new address
        log = tmp_path / "resumed.log"
        before, started_reads = set(flink_jobs(flink_cluster)), reader_starts(flink_cluster, stream.reports)
        resumed_at = time.monotonic()
        proc = start(resumed_argv, log)
        resumed = running_job(flink_cluster, before, SUBMIT_S, proc, log)
        mine.append(resumed)
        restored = flink_cluster.get(f"/jobs/{resumed}/checkpoints")["latest"]["restored"]
        assert restored and restored["external_path"] == savepoint  # it resumed; it did not start over
        resumed_bundle_s = read_started(flink_cluster, resumed, stream.reports, started_reads, proc, log, tmp_path)
        everything = topic_records(bounded.bootstrap, bounded.reports)
        wait(lambda: committed(stream) >= everything, "every report committed", RUN_S, proc, log)
        assert len(settled(stream)) == 1  # window 2 is open until the drain
        out = stop(proc)  # the drain: window 2 fires and is released
        assert proc.returncode == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        cancel_left(flink_cluster, mine)  # a failed test leaves no job holding the session cluster's slots
    drained = _summary(out)
    print(f"resumed (first bundle {resumed_bundle_s:.0f} s after its first checkpoint) and drained in "
          f"{time.monotonic() - resumed_at:.0f} s: {json.dumps(drained)[:600]}")
    assert drained["balanced"] is True and drained["accounting"]["held"] == 0
    # a stop loses no committed offset: each partition committed to its end (past the encoder's commit markers)
    assert consumer_lag(bounded.bootstrap, f"{stream.group}-shuffle", stream.reports)[1] == 0
    assert wait(lambda: flink_jobs(flink_cluster)[resumed] == "FINISHED", "the drained job FINISHED", 120,
                proc, log, alive=False) >= 0
    run_inline(bounded, ("shuffle", "analyze"))  # the reference: the bounded drain over every report
    assert len(ledger_entries(bounded, "shuffle")) == 2
    same_releases(stream, bounded)  # byte-identical releases, each window once, the same estimates
    print(f"lineage: {time.monotonic() - started:.0f} s")
