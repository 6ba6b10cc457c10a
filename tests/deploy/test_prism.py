"""The jobs on Prism, Beam's portable Go runner (built once with ``go install`` into the project's cache), with
Python workers in LOOPBACK: ``esa run`` (the three bounded jobs) and the streaming shuffler as one unbounded
pipeline with ``--streaming``. Prism runs stages side by side with real watermarks, so the streaming shuffler's
windows fire as the watermark passes them, not after the source ends as on the in-process runner.

Both must equal the in-process bounded chain over the same topic data and keys: estimate rows, release digests
and accounting. That Prism really ran them is read from the job's own log (Prism names each job it finishes).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from pipelines import analyze
from pipelines.runners import prism_binary
from tests.e2e.chain_harness import (
    REPO,
    _env,
    bounded_reference,
    cli_argv,
    estimate_rows,
    ledger_entries,
    new_chain,
    stream_read_everything,
    stream_twin,
    topic_read_ends,
    topic_records,
)

pytestmark = pytest.mark.slow
N, WINDOWS = 5_000, 2


@pytest.fixture(scope="module")
def prism() -> str:
    return prism_binary()  # from the cache; the first time on a machine, a ~3 min go build


@pytest.fixture(scope="module")
def reference(broker, tmp_path_factory):
    started = time.perf_counter()
    bounded, summaries = bounded_reference(broker.bootstrap, tmp_path_factory.mktemp("prism"), N, WINDOWS, seed=23,
                                           bad_per_kind=1)
    print(f"in-process bounded chain: {time.perf_counter() - started:.1f} s")
    return bounded, summaries


def _prism_flags(prism: str) -> list[str]:
    return ["--runner=PrismRunner", f"--prism_location={prism}", "--environment_type=LOOPBACK"]


def test_esa_run_on_prism_equals_the_in_process_run(broker, reference, prism) -> None:
    bounded, summaries = reference
    twin = new_chain(broker.bootstrap, bounded.out.parent, "prism-run", raw=bounded.raw, keys=bounded.keys)
    started = time.perf_counter()
    done = subprocess.run(cli_argv(twin, "run", *_prism_flags(prism)), env=_env(None), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    print(f"esa run on Prism: {time.perf_counter() - started:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("PrismRunner: pipeline done!") == 3, done.stderr[-3000:]  # encode, shuffle, analyze
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["balanced"]
    accounting = summary["accounting"]
    assert accounting["encode"] == summaries["encode"].accounting
    assert accounting["analyze"] == summaries["analyze"].accounting
    # The reference's reports topic also holds the bad sets a device wrote past the encoder (dead-lettered by
    # its shuffler); the twin's holds only what its encoder wrote: every other count is the same.
    shuffled = {k: v for k, v in summaries["shuffle"].accounting.items() if k not in {"read", "dead_lettered"}}
    assert {k: accounting["shuffle"][k] for k in shuffled} == shuffled
    good = summaries["shuffle"].accounting["read"] - summaries["shuffle"].accounting["dead_lettered"]
    assert accounting["shuffle"]["read"] - accounting["shuffle"]["dead_lettered"] == good
    rows = estimate_rows(twin)
    assert rows and rows == estimate_rows(bounded)
    for stage in ("shuffle", "analyze"):
        assert [e.digest for e in ledger_entries(twin, stage)] == [e.digest for e in ledger_entries(bounded, stage)]


def test_the_streaming_shuffler_on_prism_equals_the_bounded_drain(broker, reference, prism) -> None:
    bounded, summaries = reference
    stream = stream_twin(bounded, bounded.out.parent / "prism-sdf")
    reports = topic_records(broker.bootstrap, stream.reports)
    ends = topic_read_ends(broker.bootstrap, stream.reports)
    argv = cli_argv(stream, "shuffle", "--kafka_io", "sdf", "--streaming", *_prism_flags(prism))
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=_env(None), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 150
        # Offsets are committed when Prism finalizes the source's bundles: all of them means all was read.
        while not stream_read_everything(broker.bootstrap, f"{stream.group}-shuffle", stream.reports, ends):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the stream did not commit the whole topic in time"
            time.sleep(0.5)
        read_s = time.perf_counter() - started
        proc.send_signal(signal.SIGTERM)  # an operator's stop: the source finishes, every window fires, released
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"streaming shuffler on Prism: {reports:,} records committed after {read_s:.1f} s")
    assert proc.returncode == 0, err[-3000:]
    assert "PrismRunner" in err and "stopping" in err
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert summary["balanced"] and summary["accounting"] == summaries["shuffle"].accounting
    assert analyze.run(stream.config("analyze")).balanced
    assert estimate_rows(stream) == estimate_rows(bounded)
    assert [e.digest for e in ledger_entries(stream, "shuffle")] == \
        [e.digest for e in ledger_entries(bounded, "shuffle")]
