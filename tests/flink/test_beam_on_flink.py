"""The three esa jobs on a real Flink 1.19.3 session cluster through Beam 2.62.0's portable Flink runner.

The submitting ``esa`` is the one of ``deploy/flink/env`` (Beam 2.62.0, the Beam of the job server assembled
from Maven); the SDK harnesses are processes the TaskManagers start from that environment (PROCESS
environment, ``esa-sdk-harness``), never threads of the submitting process. Each run must give the estimate
rows, the release ledgers (digests of what was released) and the record accounting of the in-process chain on
the same topic data, bit for bit: with a fixed seed every random draw is a function of the record and the
crowd, never of the runner, its parallelism or its bundling, so any difference is a portability bug. And
every job the cluster ran for it is FINISHED in its ``/jobs/overview``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.end_to_end import run
from pipelines.job_config import JobConfig
from tests.flink.beam_jobs import SEED, Topics, esa, job_states, ledgers, produce, rows
from tests.flink.kills import TERMINAL, jobs_named, kill_driver_then_job_server, no_harness_left
from transforms.io.kafka.bounded import read_topic
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
N_CLIENTS = 6_000


@pytest.fixture(scope="module")
def topics(broker, tmp_path_factory: pytest.TempPathFactory) -> Topics:
    return produce(broker.bootstrap, tmp_path_factory.mktemp("beam-on-flink"), N_CLIENTS)


@pytest.fixture(scope="module")
def reference(topics: Topics) -> dict:
    """The in-process chain (FnApiRunner, this process's Beam) over the same raw topic."""
    name = "fnapi"
    config = JobConfig(bootstrap=topics.bootstrap, specs=(load_spec(topics.spec_path),), out_dir=topics.base / name,
                       state_dir=topics.base / name / "state", keys_dir=topics.base / "keys",
                       raw_topic=f"{topics.stem}-raw", reports_topic=f"{topics.stem}-{name}-rep",
                       shuffled_topic=f"{topics.stem}-{name}-shuf", group_id=f"{topics.stem}-{name}", seed=SEED,
                       drain=True)
    summary = run(config)
    assert summary.balanced, summary.accounting
    expected = rows(summary.out_dir)
    assert len(expected) == 2 * 16  # two windows x 16 items
    return {"accounting": summary.accounting, "rows": expected, "ledgers": ledgers(topics.base / name / "state")}


def _check(topics: Topics, name: str, accounting: dict, reference: dict) -> None:
    assert accounting == reference["accounting"]
    assert rows(topics.base / name) == reference["rows"]
    found = ledgers(topics.base / name / "state")
    assert found == reference["ledgers"] and all(found.values())


def _finished_jobs(cluster, before: dict[str, str]) -> dict[str, str]:
    return {jid: state for jid, state in job_states(cluster).items() if jid not in before}


def test_esa_run_on_the_cluster_starts_its_own_job_server_and_matches_in_process(
        flink_cluster, flink_env: Path, harness_options: list[str], topics: Topics, reference: dict) -> None:
    """``esa run --runner FlinkRunner --flink_master H:P`` with no ``--job_endpoint``: the job server from Maven
    is started for the command and gone after it."""
    before = job_states(flink_cluster)
    started = time.perf_counter()
    summary = esa(flink_env, "run", *topics.flags("flink-run"), "--runner=FlinkRunner",
                  f"--flink_master={flink_cluster.rest}", "--parallelism=2", *harness_options)
    print(f"esa run on Flink, parallelism 2: {time.perf_counter() - started:.0f} s")
    assert summary["balanced"] is True
    _check(topics, "flink-run", summary["accounting"], reference)
    jobs = _finished_jobs(flink_cluster, before)
    assert len(jobs) == 3 and set(jobs.values()) == {"FINISHED"}, jobs  # encode, shuffle, analyze


def test_split_encode_shuffle_analyze_on_the_cluster_match_in_process(
        flink_cluster, flink_env: Path, harness_options: list[str], job_server, topics: Topics,
        reference: dict) -> None:
    """The three jobs as three commands, each in its own state directory, through one running job server
    (``--job_endpoint``). The shuffle is first started twice with its own job server and killed mid-run
    (``tests.flink.kills.kill_driver_then_job_server``: the driver's process group, then the rerun's job server
    JVM alone): the run that completes after them, and the chain, still equal the in-process chain's, with each
    release once on the shuffled topic and no job, job server or harness left."""
    before = job_states(flink_cluster)
    name = "flink-split"
    flags = topics.flags(name)
    own = ["--runner=FlinkRunner", f"--flink_master={flink_cluster.rest}", "--parallelism=2", *harness_options]
    runner = [*own, f"--job_endpoint={job_server.endpoint}"]
    state = topics.base / name / "state"
    accounting, killed = {}, {}
    for stage in ("encode", "shuffle", "analyze"):
        stage_flags = [f for f in flags if not f.startswith("--state_dir=")] + [f"--state_dir={state / stage}"]
        if stage == "shuffle":
            started = time.perf_counter()
            killed = kill_driver_then_job_server(flink_cluster, flink_env, state / stage, [stage, *stage_flags, *own])
            print(f"two shuffle attempts killed mid-run: {time.perf_counter() - started:.0f} s; {killed}")
        summary = esa(flink_env, stage, *stage_flags, *runner)
        assert summary["balanced"] is True, summary
        accounting[stage] = summary["accounting"]
    _check(topics, name, accounting, reference)
    jobs = _finished_jobs(flink_cluster, before)
    cancelled = {killed["second"]} | ({killed["orphan"]} if killed["orphan_end"] == "CANCELED" else set())
    assert {jid: s for jid, s in jobs.items() if jid in cancelled} == dict.fromkeys(cancelled, "CANCELED"), jobs
    finished = {jid: s for jid, s in jobs.items() if jid not in cancelled}
    assert len(finished) == 3 + (killed["orphan_end"] == "FINISHED") and set(finished.values()) == {"FINISHED"}, jobs
    assert not [j for j in jobs_named(flink_cluster, killed["name"]).values() if j["state"] not in TERMINAL]
    released = sorted(r.key for r in read_topic(topics.bootstrap, f"{topics.stem}-{name}-shuf"))
    assert released == sorted(r.key for r in read_topic(topics.bootstrap, f"{topics.stem}-fnapi-shuf"))
    assert released and len(set(released)) == len(released)  # every batch of every release once
    assert no_harness_left(flink_cluster) == []



def test_java_kafkaio_reads_the_encoders_transactions_like_the_python_reader(
        flink_env: Path, harness_options: list[str], topics: Topics, reference: dict) -> None:
    """``--kafka_io xlang``: the shuffler reads the in-process chain's reports (the encoder writes them in
    transactions) with Beam's Java KafkaIO, read_committed, on embedded Flink (expansion service and job server
    assembled from Maven, the Java harness EMBEDDED in the job server): its release ledger equals the python
    reader's, and the analyzer (python reader, in process) over its output gives the same estimate rows. One
    Flink job, not three: the read is what differs, and the shuffler's input is the transactional one."""
    name = "flink-xlang"
    state = topics.base / name / "state"
    flags = [f for f in topics.flags(name) if not f.startswith(("--state_dir=", "--reports_topic="))]
    flags.append(f"--reports_topic={topics.stem}-fnapi-rep")
    started = time.perf_counter()
    shuffled = esa(flink_env, "shuffle", *flags, f"--state_dir={state / 'shuffle'}", "--kafka_io=xlang",
                   "--runner=FlinkRunner", "--flink_master=[local]", "--parallelism=2", *harness_options)
    print(f"esa shuffle --kafka_io xlang on Flink [local]: {time.perf_counter() - started:.0f} s")
    analyzed = esa(flink_env, "analyze", *flags, f"--state_dir={state / 'analyze'}")
    assert shuffled["balanced"] is True and analyzed["balanced"] is True
    assert {"shuffle": shuffled["accounting"], "analyze": analyzed["accounting"]} == {
        stage: reference["accounting"][stage] for stage in ("shuffle", "analyze")}
    assert rows(topics.base / name) == reference["rows"]
    found = ledgers(state)
    assert found == reference["ledgers"] and all(found.values())
