"""Run state persistence, run keys and the event-time watermark with idle partitions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from transforms.state.files import StateError
from transforms.state.run_state import RunState, load, run_key, source_name, watermark_ms

MIN = 60_000


def test_missing_state_is_empty_and_save_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "state" / "run_state.json"
    assert load(path) == RunState()
    state = RunState(resume={"reports/0": 10}, processed_until={"reports/0": 25}, max_event_ms={"reports/0": 5 * MIN},
                     last_data_wall_ms={"reports/0": 99}, runs=3)
    state.save(path, now_ms=1234)
    back = RunState.load(path)
    assert back == state and back.updated_at_ms == 1234


def test_invalid_state_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run_state.json"
    path.write_text('{"resume": {"reports/0": "ten"}}')
    with pytest.raises(StateError, match=r"run_state\.json"):
        RunState.load(path)
    path.write_text('{"resume": {}, "surprise": 1}')
    with pytest.raises(StateError, match="surprise"):
        RunState.load(path)


def test_source_name() -> None:
    assert source_name("reports", 3) == "reports/3"


def test_run_key_is_stable_and_depends_on_the_whole_range() -> None:
    resume, until = {"r/0": 10, "r/1": 0}, {"r/0": 20, "r/1": 5}
    key = run_key(resume, until)
    assert key == run_key(dict(reversed(resume.items())), dict(reversed(until.items())))  # order-free
    assert len(key) == 16 and int(key, 16) >= 0
    assert key != run_key({"r/0": 10, "r/1": 0}, {"r/0": 21, "r/1": 5})
    assert key != run_key({"r/0": 11, "r/1": 0}, {"r/0": 20, "r/1": 5})
    assert key != run_key(until, resume)  # the two maps are not interchangeable
    assert run_key({}, {}) == run_key({}, {})
    # Pinned: the key names files written by earlier runs, so it must not change between releases.
    assert run_key({"r/0": 1}, {"r/0": 2}) == hashlib.sha256(
        b'{"processed_until":{"r/0":2},"resume":{"r/0":1}}').hexdigest()[:16]


NOW = 100 * MIN  # the wall clock of these tests: every event time below is in its past


def test_watermark_is_the_min_over_active_partitions() -> None:
    events = {"r/0": 100 * MIN, "r/1": 90 * MIN, "r/2": 95 * MIN}
    walls = {"r/0": NOW + 1000, "r/1": NOW + 1000, "r/2": NOW + 1000}
    assert watermark_ms(events, walls, now_ms=NOW + 2000, out_of_orderness_ms=MIN, idle_timeout_ms=5000) == 89 * MIN


def test_an_idle_partition_does_not_hold_the_watermark_back() -> None:
    events = {"r/0": 100 * MIN, "r/1": 90 * MIN}
    walls = {"r/0": NOW + 10_000, "r/1": NOW + 1000}  # r/1 silent for 9.5 s of wall clock
    now = NOW + 10_500
    assert watermark_ms(events, walls, now, MIN, idle_timeout_ms=5000) == 99 * MIN
    assert watermark_ms(events, walls, now, MIN, idle_timeout_ms=9500) == 89 * MIN  # exactly at the timeout: active


def test_when_all_partitions_are_idle_time_still_advances() -> None:
    events = {"r/0": 100 * MIN, "r/1": 90 * MIN}
    walls = {"r/0": NOW - MIN, "r/1": NOW - MIN}
    assert watermark_ms(events, walls, now_ms=NOW, out_of_orderness_ms=MIN, idle_timeout_ms=5000) == 99 * MIN


def test_a_stream_gone_quiet_still_closes_its_last_window() -> None:
    # Both partitions silent for hours of wall clock: the watermark follows the wall clock (minus the idle
    # timeout and the out-of-orderness), past the last event, so the window holding it can close.
    events = {"r/0": 100 * MIN, "r/1": 90 * MIN}
    walls = {"r/0": 100 * MIN, "r/1": 100 * MIN}
    now = 300 * MIN
    assert watermark_ms(events, walls, now, MIN, idle_timeout_ms=5 * MIN) == 294 * MIN


def test_no_data_means_no_watermark_and_unknown_wall_clock_counts_as_active() -> None:
    assert watermark_ms({}, {}, 0, MIN, 5000) is None
    assert watermark_ms({}, {"r/0": 0}, 10**9, MIN, 5000) is None
    events = {"r/0": 100 * MIN, "r/1": 90 * MIN}
    assert watermark_ms(events, {"r/0": 0}, 10**9, MIN, 5000) == 89 * MIN


def test_watermark_refuses_negative_parameters() -> None:
    with pytest.raises(ValueError):
        watermark_ms({"r/0": 1}, {}, 0, -1, 0)


def test_run_state_watermark_method_matches_the_function() -> None:
    state = RunState(max_event_ms={"r/0": 100 * MIN, "r/1": 90 * MIN},
                     last_data_wall_ms={"r/0": NOW + 9000, "r/1": NOW})
    assert state.watermark_ms(NOW + 10_000, MIN, 5000) == watermark_ms(
        state.max_event_ms, state.last_data_wall_ms, NOW + 10_000, MIN, 5000) == 99 * MIN


def test_the_watermark_never_runs_ahead_of_the_wall_clock() -> None:
    """Event times ahead of the wall clock (fast device clocks, inside the skew bound) count as now."""
    events = {"r/0": 100 * MIN, "r/1": 90 * MIN}
    walls = {"r/0": 50 * MIN, "r/1": 50 * MIN}
    assert watermark_ms(events, walls, 50 * MIN, MIN, idle_timeout_ms=5000) == 49 * MIN
