"""Prometheus metrics and a health endpoint of a long-running esa job (``--metrics_port``).

Why a registry of our own and one small HTTP server: a job must not export another library's process-wide
collectors by accident, several jobs in one test process must not share counters, and ``/healthz`` answers
from the service loop's own state (is it running runs, waiting for its topic, or failing), which
``prometheus_client``'s stock server cannot. Every metric is prefixed ``esa_``, labelled by ``stage``
(encode, shuffle, analyze), and listed in docs/operations.md with an example alert. Counters add each run's
Beam counters; gauges hold the last run's view. Labels carry no identifiers: dead-letter reasons are the
identifier-free reason classes of ``transforms.state.dead_letters.reason_class``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from pipelines.exit_codes import ConfigError

LOG = logging.getLogger(__name__)

# The accounting term each stage's "released" and "deleted" counters are read from (RunSummary.parts).
RELEASED_PART = {"encode": "encoded", "shuffle": "released", "analyze": "analyzed"}
DELETED_PART = {"shuffle": "deleted"}
STATUSES = ("starting", "running", "waiting_for_topic", "out_of_space", "stopping")
UNHEALTHY = ("out_of_space",)


class JobMetrics:
    """The metrics of one job process; ``observe(summary)`` after every run."""
    def __init__(self, job: str) -> None:
        self.job = job
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.read = Counter("esa_records_read", "Kafka records read by the job's runs, each once (a held set "
                                                  "read again by a later run is not counted again)", ["stage"],
                            registry=r)
        self.dead = Counter("esa_records_dead_lettered", "Records dead-lettered, by identifier-free reason class",
                            ["stage", "reason"], registry=r)
        self.deleted = Counter("esa_records_deleted", "Message sets deleted by the shuffler's crowd threshold",
                               ["stage"], registry=r)
        self.released = Counter("esa_records_released", "Records that left the stage: events encoded, sets "
                                "released by the shuffler, batches analysed", ["stage"], registry=r)
        self.runs = Counter("esa_runs", "Bounded runs completed", ["stage"], registry=r)
        self.releases_failed = Counter("esa_releases_failed", "Releases the analyzer could not analyse (recorded "
                                       "in STATE/failed_releases, not sealed)", ["stage"], registry=r)
        self.held = Gauge("esa_held_records", "Records held for windows that are still open, after the last run",
                          ["stage"], registry=r)
        self.consumer_lag = Gauge("esa_consumer_lag_records", "Records between the job's committed offsets and "
                                  "the log end its last run saw", ["stage"], registry=r)
        self.watermark = Gauge("esa_watermark_timestamp_seconds", "Event-time watermark after the last run (Unix "
                               "seconds)", ["stage"], registry=r)
        self.watermark_lag = Gauge("esa_watermark_lag_seconds", "Wall clock minus the event-time watermark at "
                                   "the end of the last run", ["stage"], registry=r)
        self.last_release = Gauge("esa_last_release_timestamp_seconds", "When a run last released (shuffler) "
                                  "or wrote estimates (analyzer), Unix seconds", ["stage"], registry=r)
        self.last_run = Gauge("esa_last_run_timestamp_seconds", "When the last run completed, Unix seconds",
                              ["stage"], registry=r)
        self.run_seconds = Gauge("esa_last_run_duration_seconds", "Wall time of the last run", ["stage"],
                                 registry=r)
        self.epsilon = Gauge("esa_cumulative_epsilon", "Central epsilon of a population (spec, crowd) over every "
                             "window released so far, in the neighbouring notion the notion label names "
                             "(docs/mathematics.md)", ["spec", "crowd", "notion"], registry=r)
        self.up = Gauge("esa_service_status", "1 for the service loop's current status, 0 for the others",
                        ["status"], registry=r)
        self.stream = Gauge("esa_stream_total", "The streaming shuffler so far: releases, withheld windows, "
                            "refused releases, dead letters, dummy reports and records committed", ["stage", "what"],
                            registry=r)
        self._stream_released = 0
        self.status = "starting"
        self.runs_done = 0
        self.last_run_at: float | None = None
        self._lock = threading.Lock()
        self.set_status("starting")

    def set_status(self, status: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        with self._lock:
            self.status = status
            for name in STATUSES:
                self.up.labels(name).set(1.0 if name == status else 0.0)

    def observe(self, summary: Any) -> None:
        """Fold one run's summary (a RunSummary, or the chain's summary of three) into the metrics."""
        stages = getattr(summary, "stages", None) or {summary.stage: summary}
        now = time.time()
        for stage, run in stages.items():
            self._observe_stage(stage, run, now)
        with self._lock:
            self.runs_done += 1
            self.last_run_at = now

    def _observe_stage(self, stage: str, run: Any, now: float) -> None:
        progress: Mapping[str, Any] = run.extra.get("progress", {})
        read, new = run.count("kafka_records_read"), progress.get("new_records")
        # Each record once: sets held for an open window are read again by later runs (2,000 reports of the
        # README's walk-through were 5,342 reads), which would dilute the dead-letter ratio of the alert.
        self.read.labels(stage).inc(read if new is None else min(read, int(new)))
        for reason, count in progress.get("dead_by_reason", {}).items():
            self.dead.labels(stage, reason).inc(count)
        self.deleted.labels(stage).inc(int(run.parts.get(DELETED_PART.get(stage, ""), 0)))
        released = int(run.parts.get(RELEASED_PART.get(stage, ""), 0))
        self.released.labels(stage).inc(released)
        self.releases_failed.labels(stage).inc(int(progress.get("releases_failed", 0)))
        self.runs.labels(stage).inc()
        if not run.extra.get("skipped"):  # a skipped run read nothing: what is held did not change
            self.held.labels(stage).set(int(run.parts.get("held", 0)))
        if "consumer_lag" in progress:
            self.consumer_lag.labels(stage).set(int(progress["consumer_lag"]))
        watermark_ms = progress.get("watermark_ms")
        if watermark_ms is not None:
            self.watermark.labels(stage).set(watermark_ms / 1000.0)
            self.watermark_lag.labels(stage).set(max(0.0, now - watermark_ms / 1000.0))
        if run.extra.get("releases", 0) or run.extra.get("releases_written", 0):
            self.last_release.labels(stage).set(now)
        self.last_run.labels(stage).set(now)
        self.run_seconds.labels(stage).set(float(run.seconds))
        for (spec, crowd, notion), epsilon in progress.get("epsilon", {}).items():
            if epsilon is not None:
                self.epsilon.labels(spec, crowd, notion).set(float(epsilon))

    def observe_stream(self, stage: str, totals: Any, committed: int, lag: int | None) -> None:
        """The streaming shuffler's progress, between its releases (it has no runs to ``observe``): releases,
        windows withheld, dead letters and dummies so far, records committed and the consumer lag."""
        now = time.time()
        with self._lock:
            for name, value in (("releases", totals.released), ("withheld", totals.withheld),
                                ("refused", totals.conflicts), ("dead_letters", totals.dead_letters),
                                ("dummies", totals.dummies)):
                self.stream.labels(stage, name).set(float(value))
            if committed >= 0:
                self.stream.labels(stage, "committed_records").set(float(committed))
            if lag is not None:
                self.consumer_lag.labels(stage).set(float(lag))
            if totals.released > self._stream_released:
                self.last_release.labels(stage).set(now)
            self._stream_released = totals.released
            self.runs_done += 1  # each observation is a live step of the loop: /healthz reports its age
            self.last_run_at = now

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of ``/healthz``: 503 while runs fail for lack of space, else 200."""
        with self._lock:
            age = None if self.last_run_at is None else round(time.time() - self.last_run_at, 3)
            body = {"job": self.job, "status": self.status, "runs": self.runs_done, "last_run_age_seconds": age}
            return (503 if self.status in UNHEALTHY else 200), body

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        return MetricsServer(self, port, host).start()


class MetricsServer:
    """``GET /metrics`` (Prometheus text format) and ``GET /healthz`` (JSON) on a daemon thread."""
    def __init__(self, metrics: JobMetrics, port: int, host: str = "127.0.0.1") -> None:
        self.metrics = metrics
        handler = _handler(metrics)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as err:
            raise ConfigError(f"--metrics_port {port}: cannot listen on {host}:{port}: {err.strerror or err}") \
                from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="esa-metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        LOG.info("metrics on http://%s:%d/metrics, health on /healthz", self._server.server_address[0], self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(metrics: JobMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
            elif path in ("/healthz", "/health"):
                code, body = metrics.health()
                self._send(code, "application/json", json.dumps(body).encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"esa: /metrics or /healthz\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            LOG.debug("metrics http: " + format, *args)

    return Handler
