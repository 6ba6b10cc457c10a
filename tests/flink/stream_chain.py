"""Helpers of the streaming shuffler's cluster test: the streaming shuffler of the Beam 2.62.0 environment
(``esa shuffle --kafka_io sdf --streaming``) on the Flink cluster as a real process over the reports of a bounded
in-process chain (``esa shuffle --drain``, newest Beam: the reference), into its own group, state and topic; what
the two are compared on (ledger digests, estimate rows); what the cluster says about the job (state, checkpoints,
whether its reader started)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipelines.flink_cluster import LocalFlinkCluster
from tests.e2e.chain_harness import Chain, estimate_rows, ledger_entries, new_chain, recent_start, run_inline
from tests.flink.cluster import completed_checkpoints
from transforms.io.kafka.bounded import committed_offsets, ensure_topics
from transforms.io.kafka.unbounded import FIRST_BUNDLE

SEED = 29
# Measured (2026-12-02, 2-core EPYC): the job RUNNING 85 s after the driver started, each phase of the streaming
# test within 60 s (load 8-18); the lifecycle check's whole first half 277 s (load 26-28). A stalled phase costs
# its time-out, so these are about 3 times the loaded figures, not 15 minutes.
SUBMIT_S = 600  # a job submission ships ~150 MB of jars to the cluster: minutes on a loaded 2-core machine
RUN_S = 480  # a phase of the streaming test on the cluster, loaded
STALL_S = 120  # first completed checkpoint to the first bundle: 0 s measured (the bundle came first; load ~20)
# Allowed lateness 0: a window closes when the watermark passes its end, so the cluster must fire windows
# from the source's watermark while the job runs (nothing held by a side input), not only at a drain.
SPEC_TOML = """\
[analysis]
name = "flink_stream"
metric = "flink_stream"

[domain]
size = 16

[mechanism]
name = "olh"
epsilon = 3.0

[window]
size_seconds = 3600
allowed_lateness_seconds = 0

[crowd]
epsilon = 1.0
delta = 1e-6
subkeys = 4

[privacy]
delta = 1e-6
"""


def reference(bootstrap: str, base: Path, n_clients: int) -> tuple[Chain, dict[str, Any]]:
    """Two recent closed windows of ``n_clients`` reports each (plus one bad set of each kind on the reports
    topic), run through the bounded chain in this process: the releases every streaming run must equal."""
    from pipelines.demo.population import synthesize
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated
    from transforms.spec import load_spec

    base.mkdir(parents=True, exist_ok=True)
    spec_path = base / "flink_stream.toml"
    spec_path.write_text(SPEC_TOML)
    spec = load_spec(spec_path)
    chain = new_chain(bootstrap, base, "bounded", spec_path=str(spec_path), seed=SEED)
    population = synthesize(spec, n_clients, windows=2, start_ms=recent_start(spec.window_seconds * 1000, back=4),
                            seed=SEED)
    enrol_simulated(chain.keys, population.client_ids.tolist())
    produce_population(bootstrap, spec, population, raw_topic=chain.raw, reports_topic=chain.reports,
                       bad_per_kind=1, seed=SEED)
    return chain, run_inline(chain)


def twin(bounded: Chain, out: Path) -> Chain:
    """The same reports and keys, shuffled by a streaming run into its own state, group and topic."""
    stream = replace(bounded, shuffled=f"{bounded.shuffled}-{out.name}", out=out, group=f"{bounded.group}-{out.name}",
                     drain=False)
    ensure_topics(bounded.bootstrap, [stream.shuffled], partitions=3)
    return stream


def stream_argv(env: Path, chain: Chain, endpoint: str, cluster: LocalFlinkCluster, harness: list[str],
                *extra: str) -> list[str]:
    """``<env>/bin/esa shuffle --kafka_io sdf --streaming`` on the cluster through ``endpoint`` (a job server),
    checkpoints every 2 s, windows closed by a watermark that moves 5 s after the topic goes quiet."""
    return [str(env / "bin" / "esa"), "shuffle", "--spec", chain.spec_path, "--kafka_bootstrap", chain.bootstrap,
            "--output_dir", str(chain.out), "--state_dir", str(chain.state("shuffle")), "--keys_dir", str(chain.keys),
            "--raw_topic", chain.raw, "--reports_topic", chain.reports, "--shuffled_topic", chain.shuffled,
            "--consumer_group", f"{chain.group}-shuffle", "--seed", str(chain.seed), "--create_topics",
            "--kafka_io", "sdf", "--streaming", "--runner", "FlinkRunner", "--flink_master", cluster.rest,
            "--flink_version", "1.19", f"--job_endpoint={endpoint}", "--parallelism", "2",
            "--checkpointing_interval", "2000", "--idle_timeout_seconds", "5", "--out_of_orderness_seconds", "60",
            *harness, *extra]


def start(argv: list[str], log: Path) -> subprocess.Popen:
    """The driver as a real process (the newest Beam of this test process stays out of its environment)."""
    child = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.Popen(argv, env=child, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)


def flink_jobs(cluster: LocalFlinkCluster) -> dict[str, str]:
    return {j["jid"]: j["state"] for j in cluster.get("/jobs/overview")["jobs"]}


def committed(chain: Chain) -> int:
    return sum(committed_offsets(chain.bootstrap, f"{chain.group}-shuffle", chain.reports).values())


def settled(chain: Chain) -> list[Any]:
    """The shuffler's ledger entries of windows released (or withheld below threshold), not only sealed."""
    return [e for e in ledger_entries(chain, "shuffle") if e.status != "sealed"]


def running_job(cluster: LocalFlinkCluster, known: set[str], timeout_s: float, proc: subprocess.Popen,
                log: Path) -> str:
    """The id of the one job not in ``known`` once it is RUNNING (the driver must stay alive meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = {j["jid"]: j["state"] for j in cluster.get("/jobs/overview")["jobs"] if j["jid"] not in known}
        running = [jid for jid, state in jobs.items() if state == "RUNNING"]
        if running:
            return running[0]
        assert proc.poll() is None, log.read_text()[-4000:]
        time.sleep(1)
    raise AssertionError(f"no new RUNNING job within {timeout_s:.0f} s: {log.read_text()[-3000:]}")


def wait(predicate: Any, what: str, timeout_s: float, proc: subprocess.Popen, log: Path, alive: bool = True,
         every_s: float = 1.0) -> float:
    """Poll ``predicate`` every ``every_s`` until true (the driver must stay alive, unless not ``alive``); the
    seconds it took."""
    started = time.monotonic()
    while not predicate():
        assert not alive or proc.poll() is None, \
            f"the driver exited while waiting for {what}: {log.read_text()[-4000:]}"
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(every_s)
    return time.monotonic() - started


def reader_starts(cluster: LocalFlinkCluster, topic: str) -> int:
    """How often a reader of ``topic`` logged its first bundle in the TaskManagers' logs (SDK harnesses log
    through the runner; the logs are appended to across TaskManager and cluster restarts)."""
    return sum(log.read_text(errors="replace").count(f"{topic}: {FIRST_BUNDLE}")
               for log in cluster.log_dir.glob("taskmanager-*.log"))


def read_started(cluster: LocalFlinkCluster, job_id: str, topic: str, before: int, proc: subprocess.Popen,
                 log: Path, keep: Path) -> float:
    """Wait for a reader of the RUNNING job to start its first bundle; the seconds from the job's first completed
    checkpoint (every task running by then). Fail ``STALL_S`` after that checkpoint naming the stalled read
    (docs/deployment.md), the cluster's and driver's logs kept in ``keep``, rather than wait out a phase's
    time-out on a read that never begins."""
    checkpointed = None
    while reader_starts(cluster, topic) <= before:
        assert proc.poll() is None, f"the driver exited before its read started: {log.read_text()[-4000:]}"
        if checkpointed is None and completed_checkpoints(cluster, job_id) >= 1:
            checkpointed = time.monotonic()
        if checkpointed is not None and time.monotonic() - checkpointed > STALL_S:
            kept = keep / "stalled-read-logs"
            shutil.copytree(cluster.log_dir, kept, dirs_exist_ok=True)
            shutil.copy(log, kept / log.name)
            raise AssertionError(
                f"the stalled read (docs/deployment.md): job {job_id} checkpointing for {STALL_S} s and no reader "
                f"of {topic} logged '{FIRST_BUNDLE}': the keyed SDF stage never started a bundle; TaskManager "
                f"and driver logs in {kept}")
        time.sleep(1)
    return time.monotonic() - checkpointed if checkpointed is not None else 0.0


def cancel_left(cluster: LocalFlinkCluster, job_ids: list[str]) -> None:
    """Cancel those of ``job_ids`` still running (a failed test's), so later tests have the cluster's slots."""
    try:
        states = flink_jobs(cluster)
    except OSError:
        return  # the cluster is gone (stopped mid-restart): nothing runs on it
    for jid in job_ids:
        if states.get(jid) in {"RUNNING", "RESTARTING", "CREATED", "INITIALIZING"}:
            request = urllib.request.Request(f"http://{cluster.rest}/jobs/{jid}?mode=cancel", method="PATCH")
            urllib.request.urlopen(request, timeout=30).close()


def stop(proc: subprocess.Popen, timeout_s: float = 600) -> str:
    """An operator's stop (SIGTERM): the source finishes, the runner fires what is open, the agent drains."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout_s)
    return out


def same_releases(stream: Chain, bounded: Chain) -> None:
    """The analyzer (in process) over the streaming run's topic: the same ledger digests and estimate rows."""
    from pipelines import analyze

    assert analyze.run(stream.config("analyze")).balanced
    assert [e.digest for e in ledger_entries(stream, "shuffle")] == \
        [e.digest for e in ledger_entries(bounded, "shuffle")]
    rows = estimate_rows(stream)
    assert rows and rows == estimate_rows(bounded)
