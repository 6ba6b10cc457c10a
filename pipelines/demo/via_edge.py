"""The demo's devices report through the ingestion edge, as production devices do (``esa demo``'s default).

A real ``esa edge`` process is started on a free loopback port beside the broker; the simulated devices' sealed,
signed reports (``device_batch``, made chunk by chunk while the previous chunk is posted) are posted to its
``POST /v1/reports`` on concurrent pipelined keep-alive connections (``pipelines.edge.bulk_client``), and each
202 means Kafka acknowledged the report or the edge fsynced it to its spool. The demo waits until the spool is
empty (every accepted report in Kafka) before the jobs read the topic, then stops the edge with SIGTERM.

The bad records show both doors: the bad reports are posted to the edge, which refuses each with a 4xx and
writes nothing; the bad raw events (what a device that cannot run the client sends, which ``esa encode``
randomizes and seals) go to the raw topic, where the encoder dead-letters them, and the duplicate event of a
device that already reported is dead-lettered by the shuffler.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.demo.device_batch import sealed_reports
from pipelines.demo.population import Population
from pipelines.demo.simulate import bad_records
from pipelines.edge.bulk_client import post_pipelined
from pipelines.exit_codes import EsaError
from transforms.io.kafka.bounded import ensure_topics, produce_records
from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.spec import AnalysisSpec

START_TIMEOUT_S = 300.0  # a loaded 2-core machine: Python's imports and the producer's first metadata


class DemoEdgeError(EsaError):
    """The demo's edge did not start, or did not accept every simulated report (one line, exit 1)."""


@contextmanager
def demo_edge(bootstrap: str, keys_dir: Path, work_dir: Path, reports_topic: str,
              kafka_config: Mapping[str, Any] | None = None) -> Iterator[str]:
    """A running ``esa edge`` on a free loopback port (its URL); its log is ``work_dir/edge.log``. Stopped with
    SIGTERM on exit, after its spool has drained to Kafka."""
    work_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pipelines.cli", "edge", "--kafka_bootstrap", bootstrap, "--keys_dir",
            str(keys_dir), "--spool_dir", str(work_dir / "spool"), "--port", "0", "--reports_topic", reports_topic,
            "--devices_topic", f"{reports_topic}-devices", "--create_topics"]  # the run's own (unused) devices topic
    if kafka_config:
        settings = work_dir / "kafka.config"
        settings.touch(mode=0o600)
        settings.write_text("".join(f"{k}={v}\n" for k, v in kafka_config.items()))
        args += ["--kafka_config", str(settings)]
    log = work_dir / "edge.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        url = _listening(proc, log)
        yield url
        _wait_drained(url, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _listening(proc: subprocess.Popen[str], log: Path) -> str:
    found: list[str] = []

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening on" in line and not found:
                found.append(line.split("listening on", 1)[1].strip())

    threading.Thread(target=watch, name="esa-demo-edge-out", daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace").splitlines()[-5:]
            raise DemoEdgeError(f"the demo's edge did not start (exit {proc.poll()}); {log}: {' | '.join(tail)}")
        time.sleep(0.05)
    return found[0]


def _wait_drained(url: str, proc: subprocess.Popen[str], timeout_s: float = 600.0) -> None:
    """Until the edge's spool is empty: a 202 may mean "fsynced to the spool", not yet in Kafka."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as answer:
            health = json.loads(answer.read())
        if health["spool_records"] == 0:
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise DemoEdgeError(f"the edge's spool still holds {health['spool_records']} reports")
        time.sleep(0.2)


def produce_through_edge(bootstrap: str, spec: AnalysisSpec, population: Population, keys_dir: Path,
                         work_dir: Path, *, raw_topic: str, reports_topic: str, bad_per_kind: int = 0,
                         partitions: int = 3, seed: int | None = None,
                         progress: Callable[[int, int], None] | None = None, client: str = DEFAULT_CLIENT,
                         client_config: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Create the topics, start the edge, post every device's report (and the bad reports) to it, produce the
    bad raw events; returns what went where. Raises DemoEdgeError unless every device's report got a 202."""
    config = dict(client_config or {})
    ensure_topics(bootstrap, [raw_topic, reports_topic], partitions=partitions, client_config=config, client=client)
    bad = bad_records(spec, population, bad_per_kind, seed) if bad_per_kind else {"raw": [], "reports": []}
    with demo_edge(bootstrap, keys_dir, work_dir, reports_topic, config) as url:
        answers = post_pipelined(url, sealed_reports(spec, population, keys_dir, seed=seed),
                                 progress=(lambda done: progress(done, len(population))) if progress else None)
        refused = post_pipelined(url, [[value for _, value in bad["reports"]]]) if bad["reports"] else {}
    accepted = answers.pop(202, 0)
    if accepted != len(population) or answers:
        raise DemoEdgeError(f"the edge accepted {accepted:,} of {len(population):,} reports; other answers: {answers}")
    if any(status < 400 or status >= 500 for status in refused):
        raise DemoEdgeError(f"the edge answered the bad reports with {refused}, not 4xx")
    raw = produce_records(bootstrap, raw_topic, bad["raw"], producer_config=config, client=client) if bad["raw"] else 0
    return {"accepted_by_edge": accepted, "refused_by_edge": sum(refused.values()), raw_topic: raw}

