"""A rerun after a crash between seal and save redoes the sealed windows instead of skipping them.

Before this, the rerun (same run key) counted the crashed attempt's released records as re-read: its
counters no longer said what was released, and the analyzer, whose crashed attempt had sealed a release
but not written its estimates, skipped it for good (a window released zero times).
"""

from __future__ import annotations

from transforms.state.ledger import ReleaseEntry, ReleaseKey
from transforms.state.prior_runs import prior_runs
from transforms.state.run_state import RunState

WINDOW = ("spec@1", None, 3_600_000)


def _entry(run_key: str, sealed_at_ms: int) -> ReleaseEntry:
    return ReleaseEntry(key=ReleaseKey(*WINDOW), release_id="r1", digest="d", n_sets=10, n_messages=10, batches=1,
                        source_ends={"t/0": 50}, run_key=run_key, sealed_at_ms=sealed_at_ms)


def test_window_sealed_by_a_crashed_attempt_of_this_run_is_redone() -> None:
    state = RunState(processed_until={"t/0": 20}, updated_at_ms=1_000)
    prior = prior_runs(state, [_entry("k1", 2_000)], "k1")
    assert not prior.replayed(WINDOW, "t/0", 49)  # read by the crashed attempt: process it again
    assert prior.replayed(WINDOW, "t/0", 50)  # beyond what that attempt read: late


def test_window_released_by_a_completed_run_is_skipped() -> None:
    state = RunState(processed_until={"t/0": 50}, updated_at_ms=3_000)
    # same run key (a run that read nothing new), but the state was saved after the seal
    assert prior_runs(state, [_entry("k1", 2_000)], "k1").replayed(WINDOW, "t/0", 10)
    assert prior_runs(RunState(updated_at_ms=1_000), [_entry("k0", 2_000)], "k1").replayed(WINDOW, "t/0", 10)
    assert not prior_runs(state, [], "k1").replayed(WINDOW, "t/0", 10)  # never released
