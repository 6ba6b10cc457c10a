"""``nothing_to_do``: a run is skipped only when nothing new was written and no held window can have closed.

Skipping too often would hold a window back for ever (nothing new arrives on a quiet stream); skipping too
rarely re-reads every held set each poll, which the issue measured at 12 runs of 50,000 sets in 262 s.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.job import BoundedRun, nothing_to_do
from pipelines.job_config import JobConfig
from transforms.io.kafka.bounded import PartitionRange
from transforms.shuffler.plan import WindowClock
from transforms.spec import spec_from_dict
from transforms.state.run_state import RunState

HOUR = 3_600_000
SPEC = spec_from_dict({"analysis": {"name": "skip", "metric": "skip"}, "domain": {"size": 4},
                       "mechanism": {"name": "grr", "epsilon": 1.0},
                       "window": {"size_seconds": 3600, "allowed_lateness_seconds": 600}}, source="test")
EVENT = 10 * HOUR + 100_000  # the last record: 100 s into the window that ends at 11 h
WALL = EVENT  # read as it was written


def _run(now_ms: int, *, stop: int = 10, drain: bool = False, start: int = 0) -> BoundedRun:
    config = JobConfig(bootstrap="127.0.0.1:1", specs=(SPEC,), out_dir=Path("out"), drain=drain,
                       out_of_orderness_seconds=600, idle_timeout_seconds=300)
    state = RunState(resume={"t/0": 0}, processed_until={"t/0": 10}, max_event_ms={"t/0": EVENT},
                     last_data_wall_ms={"t/0": WALL}, runs=1)
    return BoundedRun(config, "shuffle", "t", state, [PartitionRange("t", 0, start, stop)], "k", "", now_ms)


def test_new_records_always_run_and_drain_runs_windowed_jobs_only() -> None:
    assert not nothing_to_do(_run(WALL + 1, stop=11), windowed=True)
    assert not nothing_to_do(_run(WALL + 1, stop=11), windowed=False)
    assert not nothing_to_do(_run(WALL + 1, drain=True), windowed=True)
    # The analyzer has no windows to drain; what it holds it retries each run (a shuffler key may have been
    # distributed since), and a run with nothing held and nothing new is skipped.
    assert not nothing_to_do(_run(WALL + 1, drain=True), windowed=False)
    assert nothing_to_do(_run(WALL + 1, drain=True, start=10), windowed=False)


def test_skipped_exactly_until_the_held_window_can_close() -> None:
    """Against the shuffler's own clock: whenever the held window (ending at 11 h) is closed at ``now`` (it was
    not at the last run) the run is not skipped; runs are skipped until the watermark passes some window's
    end plus the allowed lateness (not one poll earlier: lateness counts), and not after."""
    window_end = 11 * HOUR
    last = WindowClock(WALL, 600_000, 300_000, {"t/0": EVENT}, {"t/0": WALL})
    assert not last.closed(window_end, 600_000, last.watermark({}))
    verdicts, closes = [], []
    for now in range(WALL, WALL + 3 * HOUR, 10_000):
        clock = WindowClock(now, 600_000, 300_000, {"t/0": EVENT}, {"t/0": WALL})
        closed = clock.closed(window_end, 600_000, clock.watermark({}))
        # The check knows no held window, only where windows end: the one ending at 10 h (empty here) counts.
        any_closed = any(clock.closed(end, 600_000, clock.watermark({})) for end in (window_end - HOUR, window_end))
        skipped = nothing_to_do(_run(now), windowed=True)
        assert not (closed and skipped), now
        verdicts.append(skipped)
        closes.append(any_closed)
    assert verdicts[0] and not verdicts[-1]  # some polls skipped, and the due one runs
    first_due = verdicts.index(False)
    assert all(verdicts[:first_due]) and not any(verdicts[first_due:])
    assert first_due == closes.index(True)  # the first poll at which a window end + lateness was passed
