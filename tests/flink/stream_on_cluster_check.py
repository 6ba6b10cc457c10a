"""NOT COLLECTED by the suite (not named ``test_*``): run it by its path, ``pytest
tests/flink/stream_on_cluster_check.py``. It passed alone and after the savepoint test's cluster restart (122 s
for the two, load 1-3, 2026-12-02), but in one run of the whole Flink folder the streaming job read nothing for
5 minutes (reader started at offsets 0, 125 checkpoints completed, no commit): the keyed stage of the splittable
DoFn never started a bundle (docs/deployment.md, "The stalled read"); the cause is not found yet.

The streaming shuffler (``esa shuffle --kafka_io sdf --streaming``) of the Beam 2.62.0 environment on the local
Flink 1.19.3 cluster, SDK harnesses as processes the TaskManagers start, checkpoints every 2 s: it must release
what the bounded in-process ``esa shuffle --drain`` releases, byte for byte, with the same estimates. Each check
is one of the risks an audit of the graph against Beam's known issues named: windows fire from the source's
watermark while the job runs (allowed lateness 0), nothing held by a side input; offsets committed only once a
checkpoint completed (beam #26884) and none lost on stop; bundle finalization on Flink streaming (the committed
offsets reach the end of the topic while the job runs); the read's throughput under the SDF's re-deferral after
every bundle (beam #19637, #27648), printed. The stop is the driver's: its stop file ends the read, Flink drains
the job (``pipelines.flink_drain``) and the job is FINISHED, not cancelled.

Small data (two windows of ``N`` clients): what it costs is the job's submission and start on the cluster.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.flink_cluster import LocalFlinkCluster
from tests.e2e.chain_harness import ledger_entries, topic_records
from tests.flink.cluster import completed_checkpoints
from tests.flink.stream_chain import (
    RUN_S,
    SUBMIT_S,
    committed,
    flink_jobs,
    reference,
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
N = 300  # clients per window, two windows


@pytest.fixture(scope="module")
def bounded(broker, tmp_path_factory):
    return reference(broker.bootstrap, tmp_path_factory.mktemp("flink-stream"), N)


def test_streaming_shuffler_on_the_cluster_releases_what_the_bounded_drain_releases(
        bounded, flink_cluster: LocalFlinkCluster, flink_env: Path, harness_options: list[str], job_server,
        tmp_path: Path) -> None:
    chain, _ = bounded
    stream = twin(chain, tmp_path / "stream")
    reports = topic_records(chain.bootstrap, chain.reports)
    expected_windows = len(ledger_entries(chain, "shuffle"))
    log = tmp_path / "driver.log"
    before = set(flink_jobs(flink_cluster))
    proc = start(stream_argv(flink_env, stream, job_server.endpoint, flink_cluster, harness_options), log)
    try:
        job_id = running_job(flink_cluster, before, SUBMIT_S, proc, log)
        running_at = time.monotonic()
        # Offsets against checkpoints: the first commit comes after a completed checkpoint, never before.
        wait(lambda: committed(stream) > 0, "a first committed offset", RUN_S, proc, log)
        assert completed_checkpoints(flink_cluster, job_id) >= 1
        # Bundle finalization on Flink streaming: the whole topic committed while the job runs.
        wait(lambda: committed(stream) >= reports, "the whole topic committed", RUN_S, proc, log)
        read_s = time.monotonic() - running_at
        print(f"streaming shuffler on Flink: {reports:,} records committed {read_s:.1f} s after the job ran: "
              f"{reports / read_s:,.0f} records/s (checkpoints every 2 s)")
        # The windows fire from the watermark, with no stop: nothing is held by a side input.
        wait(lambda: len(settled(stream)) == expected_windows, "every window released while running", RUN_S,
             proc, log)
        assert flink_jobs(flink_cluster)[job_id] == "RUNNING"
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, log.read_text()[-4000:]
    # a stop loses no committed offset: each partition committed to its end (past the encoder's commit markers)
    assert consumer_lag(chain.bootstrap, f"{stream.group}-shuffle", stream.reports)[1] == 0
    deadline = time.monotonic() + 120
    while flink_jobs(flink_cluster)[job_id] != "FINISHED":  # the drain ends the job; it is not cancelled
        assert time.monotonic() < deadline, flink_jobs(flink_cluster)[job_id]
        time.sleep(1)
    same_releases(stream, chain)
