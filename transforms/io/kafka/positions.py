"""The unbounded reader's restriction and watermark over *every* partition of a topic at once.

Why one restriction for the whole topic, not one SDF element per partition: a runner holds the watermark of an
SDF element only once it has started (its checkpointed residual carries the estimator's hold). An element that
is still queued holds nothing, so on Beam 2.62's Flink runner the output watermark followed the started
partitions and passed records an unstarted partition still held: windows fired without them and their sets
came out late (measured on a Flink 1.19 cluster, docs/deployment.md). With one element, the first bundle
starts the read of every partition, and the watermark it reports is the minimum over all of them: a partition
that has seen nothing yet (and is not idle) holds it at its minimum.

``TopicPositions`` is the next offset to read per partition; the tracker claims ``(partition, offset)`` in
offset order per partition and splits only at a checkpoint (``defer_remainder``): the residual is the same
topic from the positions reached. ``TopicWatermark`` keeps one ``PartitionWatermark`` per partition in its
state, so a restored residual resumes every partition's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apache_beam.coders import coders
from apache_beam.io.iobase import RestrictionProgress, RestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms.core import WatermarkEstimatorProvider
from apache_beam.utils.timestamp import Timestamp

PartitionState = tuple[int | None, int | None, int]  # (watermark ms, max trusted event ms, last record wall ms)


@dataclass(frozen=True)
class SourceClock:
    """How a partition's watermark moves and when an idle partition ends (milliseconds; None: never)."""

    out_of_orderness_ms: int = 600_000
    idle_timeout_ms: int = 300_000
    stop_after_idle_ms: int | None = None

    def __post_init__(self) -> None:
        if self.out_of_orderness_ms < 0 or self.idle_timeout_ms < 0:
            raise ValueError("out_of_orderness and idle_timeout must be >= 0")
        if self.stop_after_idle_ms is not None and self.stop_after_idle_ms < 0:
            raise ValueError(f"stop_after_idle must be >= 0 or None, got {self.stop_after_idle_ms}")


@dataclass(frozen=True)
class TopicPositions:
    """Per partition the next offset to read (sorted by partition); ``done``: nothing is left to read."""

    starts: tuple[tuple[int, int], ...]
    done: bool = False

    def of(self) -> dict[int, int]:
        return dict(self.starts)


def positions(starts: Mapping[int, int], done: bool = False) -> TopicPositions:
    return TopicPositions(tuple(sorted((int(p), int(o)) for p, o in starts.items())), done)


class TopicPositionsTracker(RestrictionTracker):
    """Claims ``(partition, offset)``, each partition's offsets in increasing order; ``try_claim(None)`` claims
    nothing and marks the read finished. It splits only at a checkpoint (fraction 0): the primary ends where
    the claims stand, the residual resumes from there. The work never ends by itself (``is_bounded``)."""

    def __init__(self, restriction: TopicPositions):
        self._restriction = restriction
        self._next = restriction.of()
        self._claimed = 0
        self._finished = restriction.done
        self._split = False

    def current_restriction(self) -> TopicPositions:
        return self._restriction

    def try_claim(self, position: tuple[int, int] | None) -> bool:
        if self._finished or self._split:
            return False
        if position is None:
            self._finished = True
            self._restriction = positions(self._next, done=True)
            return False
        partition, offset = position
        if partition not in self._next:
            raise ValueError(f"partition {partition} is not in this read ({sorted(self._next)})")
        if offset < self._next[partition]:
            raise ValueError(f"offset {offset} of partition {partition} claimed again (next {self._next[partition]})")
        self._next[partition] = offset + 1
        self._claimed += 1
        return True

    def try_split(self, fraction_of_remainder: float) -> tuple[TopicPositions, TopicPositions] | None:
        if fraction_of_remainder != 0 or self._finished or self._split:
            return None  # only a checkpoint: a partition's records are read in order by one reader
        self._split = True
        primary, residual = positions(self._next, done=True), positions(self._next)
        self._restriction = primary
        return primary, residual

    def check_done(self) -> None:
        if not (self._finished or self._split):
            raise ValueError("the read neither finished nor checkpointed its remainder")

    def current_progress(self) -> RestrictionProgress:
        return RestrictionProgress(completed=float(self._claimed), remaining=0.0 if self._finished else 1.0)

    def is_bounded(self) -> bool:
        return False


class PartitionWatermark(ManualWatermarkEstimator):
    """A partition's watermark, with what moves it: (watermark ms, max trusted event ms, last record wall ms).

    Methods only: the SDK wraps an estimator in a thread-safe proxy that forwards calls, not attributes.
    """

    def __init__(self, state: PartitionState):
        watermark, self._max_event, self._last_data = state
        super().__init__(None if watermark is None else Timestamp(micros=watermark * 1000))
        self._watermark_ms = watermark

    def observe(self, max_event_ms: int | None, now_ms: int) -> None:
        """A chunk arrived at ``now_ms``; ``max_event_ms`` is its largest trusted event time, if any."""
        self._last_data = now_ms
        if max_event_ms is not None:
            self._max_event = max_event_ms if self._max_event is None else max(self._max_event, max_event_ms)

    def idle_ms(self, now_ms: int) -> int:
        return now_ms - self._last_data

    def advance(self, now_ms: int, clock: SourceClock) -> int | None:
        """Move the watermark forward (never back); returns it in ms (None: nothing seen yet, not idle).

        Never past ``now - out_of_orderness``: a device clock running ahead must not close windows early."""
        candidates = []
        if self._max_event is not None:
            candidates.append(min(self._max_event, now_ms) - clock.out_of_orderness_ms)
        if self.idle_ms(now_ms) >= clock.idle_timeout_ms:
            candidates.append(now_ms - clock.out_of_orderness_ms)
        if candidates and (self._watermark_ms is None or max(candidates) > self._watermark_ms):
            self._watermark_ms = max(candidates)
            self.set_watermark(Timestamp(micros=self._watermark_ms * 1000))
        return self._watermark_ms

    def watermark_ms(self) -> int | None:
        return self._watermark_ms

    def get_estimator_state(self) -> PartitionState:
        return self._watermark_ms, self._max_event, self._last_data


class TopicWatermark(ManualWatermarkEstimator):
    """The read's watermark: the minimum of its partitions' (``PartitionWatermark``); while any partition has
    neither a trusted event time nor an idle time-out behind it, nothing (the runner holds at its minimum)."""

    def __init__(self, state: tuple[tuple[int, PartitionState], ...]):
        self._parts = {p: PartitionWatermark(tuple(s)) for p, s in state}  # type: ignore[arg-type]
        low = self._low()
        super().__init__(None if low is None else Timestamp(micros=low * 1000))

    def _low(self) -> int | None:
        marks = [w.watermark_ms() for w in self._parts.values()]
        return None if not marks or any(m is None for m in marks) else min(marks)  # type: ignore[type-var]

    def observe(self, partition: int, max_event_ms: int | None, now_ms: int) -> None:
        self._parts[partition].observe(max_event_ms, now_ms)

    def idle_ms(self, now_ms: int) -> int:
        """How long the busiest partition has been without a record."""
        return min(w.idle_ms(now_ms) for w in self._parts.values())

    def advance(self, now_ms: int, clock: SourceClock) -> int | None:
        for mark in self._parts.values():
            mark.advance(now_ms, clock)
        low = self._low()
        if low is not None:
            self.set_watermark(Timestamp(micros=low * 1000))
        return low

    def watermark_ms(self) -> int | None:
        return self._low()

    def get_estimator_state(self) -> tuple[tuple[int, PartitionState], ...]:
        return tuple((p, w.get_estimator_state()) for p, w in sorted(self._parts.items()))


class TopicWatermarkProvider(WatermarkEstimatorProvider):
    """Every partition of the restriction starts with nothing seen, its idle time counted from ``now``."""

    def __init__(self, now_ms: Any):
        self._now_ms = now_ms  # a function: the wall clock in ms

    def initial_estimator_state(self, element: Any, restriction: TopicPositions
                                ) -> tuple[tuple[int, PartitionState], ...]:
        now = self._now_ms()
        return tuple((p, (None, None, now)) for p, _ in restriction.starts)

    def create_watermark_estimator(self, state: tuple[tuple[int, PartitionState], ...]) -> TopicWatermark:
        return TopicWatermark(tuple(state))

    def estimator_state_coder(self) -> coders.Coder:
        return coders.FastPrimitivesCoder()
