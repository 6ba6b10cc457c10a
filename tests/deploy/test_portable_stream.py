"""``esa shuffle --kafka_io sdf`` through the portable job API with an EXTERNAL worker pool: the path a
streaming job takes on Flink or Dataflow (the unbounded source, the windows and the staging run in separate
SDK worker processes; the driver keeps the ledger and publishes).

The command runs as a real ``esa`` process without ``--stop_after_idle_seconds``: it would run forever, so the
test stops it the way an operator does, with SIGTERM, once the group's committed offsets (committed on bundle
finalization) reached the end of the topic. The stop finishes the source, the runner fires every window, the
release agent releases them and the process exits 0. Then the normal bounded analyzer: its estimates must be
identical to the in-process bounded ``esa shuffle --drain`` chain over the same reports (same keys, seeds).
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from pipelines import analyze
from tests.deploy.portable import local_job_service, worker_pool
from tests.e2e.chain_harness import (
    SPEC_PATH,
    _env,
    bounded_reference,
    cli_argv,
    estimate_rows,
    ledger_entries,
    stream_read_everything,
    stream_twin,
    topic_read_ends,
    topic_records,
)
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
N, WINDOWS = 20_000, 2


def test_sdf_shuffle_on_an_external_worker_pool_equals_the_in_process_bounded_drain(broker, tmp_path) -> None:
    import subprocess

    spec = load_spec(SPEC_PATH)
    started = time.perf_counter()
    bounded, reference = bounded_reference(broker.bootstrap, tmp_path, N, WINDOWS, seed=23, bad_per_kind=1)
    print(f"in-process bounded chain (encode, shuffle --drain, analyze): {time.perf_counter() - started:.1f} s")
    stream = stream_twin(bounded, tmp_path / "sdf")
    reports = topic_records(broker.bootstrap, stream.reports)
    ends = topic_read_ends(broker.bootstrap, stream.reports)

    with local_job_service(tmp_path) as endpoint, worker_pool(tmp_path) as pool:
        argv = cli_argv(stream, "shuffle", "--kafka_io", "sdf", "--runner=PortableRunner",
                        f"--job_endpoint={endpoint}", "--environment_type=EXTERNAL", f"--environment_config={pool}")
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        group = f"{stream.group}-shuffle"
        try:
            deadline = time.monotonic() + 300  # loaded machines: the bound only stops a stuck stream
            while not stream_read_everything(broker.bootstrap, group, stream.reports, ends):
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "the stream did not commit the whole topic in time"
                time.sleep(0.5)
            read_s = time.perf_counter() - started
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    seconds = time.perf_counter() - started
    print(f"portable EXTERNAL sdf shuffle: {reports:,} records committed after {read_s:.1f} s, "
          f"exited {seconds:.1f} s after start")
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert summary["balanced"], summary
    assert summary["accounting"]["read"] == reports
    assert summary["accounting"] == reference["shuffle"].accounting
    assert "stopping" in err  # the SIGTERM path: the source finished, the windows fired, the agent drained

    analyzed = analyze.run(stream.config("analyze"))
    assert analyzed.balanced
    rows = estimate_rows(stream)
    assert len(rows) == WINDOWS * spec.d and rows == estimate_rows(bounded)
    assert [e.digest for e in ledger_entries(stream, "shuffle")] == \
        [e.digest for e in ledger_entries(bounded, "shuffle")]
