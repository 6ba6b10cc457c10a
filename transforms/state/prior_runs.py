"""What earlier runs of a job decided, as the ingress steps of the shuffler and the analyzer consult it.

Both domains read their own ledger and run state through these few lines, so neither imports the other's
code: the shuffler skips windows it released, the analyzer windows it estimated, and a crashed attempt of
the same run is redone rather than skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transforms.state.verified_sets import VerifiedSets


@dataclass(frozen=True)
class PriorRuns:
    """What earlier runs decided, passed to the workers as constants (small: one entry per window)."""

    processed_until: Mapping[str, int] = field(default_factory=dict)  # "topic/partition" -> end of last run
    released: Mapping[tuple[str, str | None, int], Mapping[str, int]] = field(default_factory=dict)
    # (spec_id, crowd_id, window_end_ms) -> "topic/partition" -> end offset of the read that sealed it
    redo: frozenset[tuple[str, str | None, int]] = frozenset()
    read_clock: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    verified: VerifiedSets = field(default_factory=VerifiedSets)  # signatures earlier runs checked
    # "topic/partition" -> ((end offset, run clock), ...): the clock a re-read record was first judged by, so
    # a set held in an open window cannot turn stale (and vanish) while it waits
    # windows sealed by a crashed attempt of *this* run (same run key): their records below the source ends
    # are processed again, so the rerun reproduces, publishes and counts the release the crash interrupted

    def first_clock(self, pkey: str, offset: int) -> int | None:
        for end, clock in self.read_clock.get(pkey, ()):
            if offset < end:
                return clock
        return None

    def replayed(self, key: tuple[str, str | None, int], pkey: str, offset: int) -> bool:
        """Whether a record of window ``key`` at ``offset`` was already released (False: process it)."""
        ends = self.released.get(key)
        return ends is not None and not (key in self.redo and offset < ends.get(pkey, 0))


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def released_lookup(entries: Iterable[Any]) -> Mapping[tuple[str, str | None, int], Mapping[str, int]]:
    """Ledger entries -> the (spec, crowd, window) -> source ends map the ingress steps consult."""
    return {(e.key.spec_id, e.key.crowd_id, e.key.window_end_ms): dict(e.source_ends) for e in entries}


def prior_runs(state: Any, entries: Iterable[Any], run_key: str) -> PriorRuns:
    """What the ingress steps must know of earlier runs (``state``: the job's saved RunState).

    An entry sealed under this ``run_key`` *after* the state was last saved is a crashed attempt of this
    very run (same input range, state never saved): its window is redone rather than skipped as re-read,
    so the rerun reproduces the identical release, publishes it if need be and counts its records once.
    """
    entries = list(entries)
    redo = frozenset((e.key.spec_id, e.key.crowd_id, e.key.window_end_ms) for e in entries
                     if e.run_key == run_key and e.sealed_at_ms >= state.updated_at_ms)
    clocks = {pkey: tuple((int(end), int(clock)) for end, clock in entries_)
              for pkey, entries_ in getattr(state, "read_clock", {}).items()}
    return PriorRuns(processed_until=dict(state.processed_until), released=released_lookup(entries), redo=redo,
                     read_clock=clocks)
