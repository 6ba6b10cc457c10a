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
from types import FrameType
from typing import Any

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


def progress_line(summary: Any) -> str:
    """records/s, held (open windows) and dead letters of one run, for the operator's log."""
    stages = getattr(summary, "stages", None) or {summary.stage: summary}
    parts = []
    for name, stage in stages.items():
        read = stage.count("kafka_records_read")
        rate = read / stage.seconds if stage.seconds > 0 else 0.0
        held = stage.parts.get("held", 0)
        parts.append(f"{name}: read {read:,} ({rate:,.0f}/s), held in open windows {held:,}, "
                     f"dead-lettered {stage.count('dead_lettered'):,}")
    return "; ".join(parts)


def follow(run_once: Callable[[], Any], poll_seconds: float, max_runs: int | None = None) -> list[Any]:
    """Run ``run_once`` repeatedly (pausing ``poll_seconds`` after a run that read nothing) until stopped.

    A missing input topic is waited for, not fatal: jobs started side by side must not die because the
    job upstream has not published yet (its warning names the closest topic, in case of a typo).
    """
    from pipelines.preflight import MissingTopicsError

    summaries: list[Any] = []
    waiting_for = ""
    with StopRequest() as stop:
        while not stop.requested and (max_runs is None or len(summaries) < max_runs):
            try:
                summary = run_once()
            except MissingTopicsError as err:
                if str(err) != waiting_for:
                    LOG.warning("waiting for the input topic: %s", err)
                    waiting_for = str(err)
                stop.sleep(poll_seconds)
                continue
            waiting_for = ""
            summaries.append(summary)
            LOG.info("run %d: %s", len(summaries), progress_line(summary))
            if summary.count("kafka_records_read") == 0:
                stop.sleep(poll_seconds)
    LOG.info("stopped after %d run(s)", len(summaries))
    return summaries
