"""Continuous mode (``--follow``): one bounded run after another, until SIGINT or SIGTERM.

Each run is exactly-once on its own (``pipelines.job``), so the service is too: a signal only sets a flag,
the run in progress finishes -- releases sealed and published, state saved, offsets committed -- and the
loop stops before the next one. A second signal exits at once (what is not committed is redone by the
next start). Between runs the loop logs its progress: records per second, records held in windows that
are still open, and the backlog seen by the run.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from pipelines.metrics import DELETED_PART, RELEASED_PART, JobMetrics
from pipelines.out_of_space import out_of_space
from pipelines.preflight import MissingTopicsError

LOG = logging.getLogger("esa.service")


class StopRequest:
    """SIGINT/SIGTERM -> ``requested``; the second signal raises KeyboardInterrupt."""
    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        LOG.warning("%s: stopping after the current run commits (send again to exit at once)",
                    signal.Signals(signum).name)

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.requested and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))


def stage_progress(name: str, stage: Any) -> dict[str, Any]:
    """One stage's run, as the fields of its progress line (and of the JSON log line)."""
    progress = stage.extra.get("progress", {}) if hasattr(stage, "extra") else {}
    read = stage.count("kafka_records_read")
    out: dict[str, Any] = {"stage": name, "read": read, "seconds": round(float(stage.seconds), 3),
                           "released": int(stage.parts.get(RELEASED_PART.get(name, ""), 0)),
                           "held": int(stage.parts.get("held", 0)), "dead_lettered": stage.count("dead_lettered"),
                           "dead_by_reason": dict(progress.get("dead_by_reason", {}))}
    if name in DELETED_PART:
        out["deleted"] = int(stage.parts.get(DELETED_PART[name], 0))
    for key in ("watermark_ms", "consumer_lag", "releases_failed"):
        if key in progress:
            out[key] = progress[key]
    if progress.get("watermark_ms") is not None and progress.get("now_ms") is not None:
        out["watermark_lag_s"] = round((progress["now_ms"] - progress["watermark_ms"]) / 1000.0, 1)
    return out


def _format_stage(p: dict[str, Any]) -> str:
    rate = p["read"] / p["seconds"] if p["seconds"] > 0 else 0.0
    text = f"{p['stage']}: read {p['read']:,} ({rate:,.0f}/s), released {p['released']:,}, held {p['held']:,}"
    if "deleted" in p:
        text += f", deleted {p['deleted']:,}"
    text += f", dead-lettered {p['dead_lettered']:,}"
    if p["dead_by_reason"]:
        text += " (" + ", ".join(f"{r} {c:,}" for r, c in sorted(p["dead_by_reason"].items())) + ")"
    if p.get("releases_failed"):
        text += f", releases failed {p['releases_failed']}"
    if "watermark_ms" in p:
        mark = p["watermark_ms"]
        text += (", watermark none (drain)" if mark is None else
                 f", watermark {datetime.fromtimestamp(mark / 1000, UTC):%Y-%m-%dT%H:%M:%SZ} "
                 f"(lag {p.get('watermark_lag_s', 0):,.0f} s)")
    if "consumer_lag" in p:
        text += f", consumer lag {p['consumer_lag']:,}"
    return text


def progress(summary: Any) -> list[dict[str, Any]]:
    stages = getattr(summary, "stages", None) or {summary.stage: summary}
    return [stage_progress(name, stage) for name, stage in stages.items()]


def progress_line(summary: Any) -> str:
    """read, released, held, dead letters by reason, watermark and lag of one run, for the operator's log."""
    return "; ".join(_format_stage(p) for p in progress(summary))


OUT_OF_SPACE_MAX_PAUSE_S = 300.0


def out_of_space_pause(poll_seconds: float, refused: int) -> float:
    """Seconds to wait after the ``refused``-th run in a row failed for lack of space: doubling from the poll
    interval (at least 5 s), at most five minutes, so a service waits out a full disk without spinning."""
    return min(max(poll_seconds, 5.0) * 2.0 ** (refused - 1), OUT_OF_SPACE_MAX_PAUSE_S)


def follow(run_once: Callable[[], Any], poll_seconds: float, max_runs: int | None = None,
           metrics: JobMetrics | None = None) -> list[Any]:
    """Run ``run_once`` repeatedly (pausing ``poll_seconds`` after a run that read nothing) until stopped.

    A missing input topic is waited for, not fatal: jobs started side by side must not die because the
    job upstream has not published yet (its warning names the closest topic, in case of a typo). A run that
    fails for lack of space is retried too (``out_of_space_pause``): it is redone whole, like a crashed run,
    and a service left running for months should outlast a full disk that an operator or log rotation frees.
    Each run logs one progress line at INFO (its fields also as the ``esa`` extra, for ``--log_format json``)
    and, with ``metrics``, updates the job's Prometheus metrics and health status.
    """
    summaries: list[Any] = []
    waiting_for = ""
    refused = 0  # runs in a row that failed for lack of space
    was_idle = False
    with StopRequest() as stop:
        while not stop.requested and (max_runs is None or len(summaries) < max_runs):
            try:
                summary = run_once()
            except MissingTopicsError as err:
                _status(metrics, "waiting_for_topic")
                if str(err) != waiting_for:
                    LOG.warning("waiting for the input topic: %s", err)
                    waiting_for = str(err)
                stop.sleep(poll_seconds)
                continue
            except Exception as err:
                words = out_of_space(err)
                if words is None:
                    raise
                refused += 1
                _status(metrics, "out_of_space")
                pause = out_of_space_pause(poll_seconds, refused)
                LOG.error("run failed, out of space: %s. Nothing is lost: the next attempt redoes this run (it "
                          "first deletes this attempt's staged files). Free space under the state, keys, staging "
                          "and output locations; retrying in %.0f s (attempt %d)", words, pause, refused + 1)
                stop.sleep(pause)
                continue
            waiting_for, refused = "", 0
            summaries.append(summary)
            if metrics is not None:
                metrics.observe(summary)
            _status(metrics, "running")
            idle = summary.count("kafka_records_read") == 0
            # An idle run after an idle run is logged at DEBUG: a quiet service does not fill its log.
            LOG.log(logging.DEBUG if idle and was_idle else logging.INFO, "run %d: %s", len(summaries),
                    progress_line(summary),
                    extra={"esa": {"event": "run", "run": len(summaries), "stages": progress(summary)}})
            was_idle = idle
            if idle:
                stop.sleep(poll_seconds)
        _status(metrics, "stopping")
    LOG.info("stopped after %d run(s)", len(summaries))
    return summaries


def _status(metrics: JobMetrics | None, status: str) -> None:
    if metrics is not None:
        metrics.set_status(status)
