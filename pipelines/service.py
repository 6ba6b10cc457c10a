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

from pipelines.out_of_space import out_of_space

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


OUT_OF_SPACE_MAX_PAUSE_S = 300.0


def out_of_space_pause(poll_seconds: float, refused: int) -> float:
    """Seconds to wait after the ``refused``-th run in a row failed for lack of space: doubling from the poll
    interval (at least 5 s), at most five minutes, so a service waits out a full disk without spinning."""
    return min(max(poll_seconds, 5.0) * 2.0 ** (refused - 1), OUT_OF_SPACE_MAX_PAUSE_S)


def follow(run_once: Callable[[], Any], poll_seconds: float, max_runs: int | None = None) -> list[Any]:
    """Run ``run_once`` repeatedly (pausing ``poll_seconds`` after a run that read nothing) until stopped.

    A missing input topic is waited for, not fatal: jobs started side by side must not die because the
    job upstream has not published yet (its warning names the closest topic, in case of a typo). A run that
    fails for lack of space is retried too (``out_of_space_pause``): it is redone whole, like a crashed run,
    and a service left running for months should outlast a full disk that an operator or log rotation frees.
    """
    from pipelines.preflight import MissingTopicsError

    summaries: list[Any] = []
    waiting_for = ""
    refused = 0  # runs in a row that failed for lack of space
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
            except Exception as err:
                words = out_of_space(err)
                if words is None:
                    raise
                refused += 1
                pause = out_of_space_pause(poll_seconds, refused)
                LOG.error("run failed, out of space: %s. Nothing is lost: the next attempt redoes this run (it "
                          "first deletes this attempt's staged files). Free space under the state, keys, staging "
                          "and output locations; retrying in %.0f s (attempt %d)", words, pause, refused + 1)
                stop.sleep(pause)
                continue
            waiting_for, refused = "", 0
            summaries.append(summary)
            LOG.info("run %d: %s", len(summaries), progress_line(summary))
            if summary.count("kafka_records_read") == 0:
                stop.sleep(poll_seconds)
    LOG.info("stopped after %d run(s)", len(summaries))
    return summaries
