"""The streaming shuffler serves Prometheus metrics while it runs (``esa shuffle --kafka_io sdf --metrics_port``).

A real process on a real broker: scraped while it streams, ``/metrics`` shows the records its source
committed and the consumer lag falling to 0, ``/healthz`` answers 200. On the local runner the source runs to
its idle stop before any window fires, so the releases themselves are checked on the metrics object the loop
feeds (on Prism, Flink or Dataflow they are published, and counted, while the stream runs). Before this,
``--metrics_port`` was refused for the streaming shuffler, which only logged its progress.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.request

import pytest

from pipelines.metrics import JobMetrics
from tests.e2e.chain_harness import _env, bounded_reference, cli_argv, stream_twin
from transforms.io.kafka.bounded import committed_offsets
from transforms.shuffler.release_agent import AgentTotals

pytestmark = pytest.mark.slow
N, WINDOWS = 600, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The ``esa_stream_total`` and consumer-lag samples of the endpoint, by their ``what`` label."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {m.group(1): float(m.group(2))
           for m in re.finditer(r'^esa_stream_total\{stage="shuffle",what="(\w+)"\} (\S+)$', text, re.M)}
    lag = re.search(r'^esa_consumer_lag_records\{stage="shuffle"\} (\S+)$', text, re.M)
    if lag:
        out["lag"] = float(lag.group(1))
    return out


def test_the_streaming_shuffler_serves_its_progress_while_it_runs(broker, tmp_path) -> None:
    bounded, _ = bounded_reference(broker.bootstrap, tmp_path, N, WINDOWS, seed=23)
    stream = stream_twin(bounded, tmp_path / "sdf")
    port = free_port()
    argv = cli_argv(stream, "shuffle", "--kafka_io", "sdf", "--stop_after_idle_seconds", "8",
                    "--metrics_port", str(port))
    proc = subprocess.Popen(argv, env=_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[dict[str, float]] = []
    health = None
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                sample = scrape(port)
                if sample:
                    seen.append(sample)
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                        health = (answer.status, json.loads(answer.read()))
            except OSError:
                pass  # not listening yet, or already closed
            time.sleep(0.5)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert seen, f"no scrape answered while the stream ran\n{err[-3000:]}"
    assert max(s.get("committed_records", 0) for s in seen) >= N
    assert any(s.get("lag", -1) > 0 for s in seen) or seen[0].get("committed_records", 0) >= N
    assert seen[-1].get("lag") == 0 and seen[-1].get("dead_letters") == 0
    assert health is not None and health[0] == 200 and health[1]["job"] == "shuffle"
    assert health[1]["status"] in ("running", "stopping")
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert summary["balanced"]


def test_the_metrics_count_releases_withheld_windows_and_dummies() -> None:
    metrics = JobMetrics("shuffle")
    metrics.observe_stream("shuffle", AgentTotals(released=0), committed=10, lag=5)
    assert metrics.registry.get_sample_value("esa_last_release_timestamp_seconds", {"stage": "shuffle"}) is None
    metrics.observe_stream("shuffle", AgentTotals(released=2, withheld=1, dead_letters=3, dummies=56),
                           committed=600, lag=0)
    value = metrics.registry.get_sample_value
    assert value("esa_stream_total", {"stage": "shuffle", "what": "releases"}) == 2
    assert value("esa_stream_total", {"stage": "shuffle", "what": "withheld"}) == 1
    assert value("esa_stream_total", {"stage": "shuffle", "what": "dead_letters"}) == 3
    assert value("esa_stream_total", {"stage": "shuffle", "what": "dummies"}) == 56
    assert value("esa_stream_total", {"stage": "shuffle", "what": "committed_records"}) == 600
    assert value("esa_consumer_lag_records", {"stage": "shuffle"}) == 0
    assert value("esa_last_release_timestamp_seconds", {"stage": "shuffle"}) > 0
    assert metrics.health()[0] == 200


def test_a_taken_metrics_port_is_one_line_and_nothing_is_read(broker, tmp_path) -> None:
    """One line, exit 3, no record committed. (The driver binds the port before it submits the stream, so a
    job on a cluster is never left without its driver; the in-process runner here cannot show that part.)"""
    bounded, _ = bounded_reference(broker.bootstrap, tmp_path, 200, 1, seed=29)
    stream = stream_twin(bounded, tmp_path / "sdf")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = cli_argv(stream, "shuffle", "--kafka_io", "sdf", "--stop_after_idle_seconds", "2",
                        "--metrics_port", str(port))
        done = subprocess.run(argv, env=_env(None), capture_output=True, text=True, timeout=180)
    assert done.returncode == 3, done.stderr[-3000:]
    assert f"--metrics_port {port}: cannot listen" in done.stderr and "Traceback" not in done.stderr
    assert committed_offsets(broker.bootstrap, f"{stream.group}-shuffle", stream.reports) == {}
