"""Per-job progress: where the next run resumes, and the event-time watermark it may use.

Kafka consumer-group offsets are not the source of truth: a job commits its progress here, atomically, after
its outputs are durable (sealed in the ledger, written to the stores). A crash before that leaves the old
state, so the rerun reads the same range again, gets the same ``run_key`` and overwrites the crashed
attempt's run-keyed outputs instead of adding to them.

All maps are keyed by ``"topic/partition"``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transforms.state.files import StateError, atomic_write_json, read_json

_MAPS = ("resume", "processed_until", "max_event_ms", "last_data_wall_ms")


def source_name(topic: str, partition: int) -> str:
    """The ``"topic/partition"`` key of the maps (topic names cannot contain '/', so it is unambiguous)."""
    return f"{topic}/{int(partition)}"


@dataclass
class RunState:
    """``resume``: next offset to read; ``processed_until``: end (exclusive) of what the last run consumed;
    ``max_event_ms``: largest event time seen; ``last_data_wall_ms``: wall clock of the last record read."""

    resume: dict[str, int] = field(default_factory=dict)
    processed_until: dict[str, int] = field(default_factory=dict)
    max_event_ms: dict[str, int] = field(default_factory=dict)
    last_data_wall_ms: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    updated_at_ms: int = 0
    # "topic/partition" -> [[end offset, clock of the run that first read up to it], ...], for offsets a later
    # run may read again (at or above ``resume``): a re-read record is judged by the clock of its first read
    read_clock: dict[str, list[list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _MAPS:
            for source, value in getattr(self, name).items():
                if not isinstance(source, str) or "/" not in source:
                    raise ValueError(f"{name}: key {source!r} is not 'topic/partition'")
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"{name}[{source!r}] must be an int, got {value!r}")

    @classmethod
    def load(cls, path: Path) -> RunState:
        """The state saved at ``path``; an empty state (first run) if there is none."""
        obj = read_json(Path(path))
        if obj is None:
            return cls()
        try:
            return cls(**obj)
        except (TypeError, ValueError) as err:
            raise StateError(f"invalid run state {path}: {err}") from None

    def save(self, path: Path, now_ms: int | None = None) -> None:
        """Atomically replace the state at ``path`` (stamping ``updated_at_ms``)."""
        self.updated_at_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        atomic_write_json(Path(path), asdict(self))

    def watermark_ms(self, now_ms: int, out_of_orderness_ms: int, idle_timeout_ms: int) -> int | None:
        return watermark_ms(self.max_event_ms, self.last_data_wall_ms, now_ms, out_of_orderness_ms, idle_timeout_ms)


def load(path: Path) -> RunState:
    """``RunState.load``."""
    return RunState.load(path)


def run_key(resume: Mapping[str, int], processed_until: Mapping[str, int]) -> str:
    """16 hex digits of SHA-256 of the canonical JSON of the run's input range.

    A rerun after a crash starts from the same saved ``resume`` and, given the same ``processed_until``
    snapshot, reads the same records: the same key, so its run-keyed outputs replace the crashed attempt's.
    """
    canonical = json.dumps({"processed_until": {k: int(v) for k, v in processed_until.items()},
                            "resume": {k: int(v) for k, v in resume.items()}},
                           sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def watermark_ms(max_event_ms: Mapping[str, int], last_data_wall_ms: Mapping[str, int], now_ms: int,
                 out_of_orderness_ms: int, idle_timeout_ms: int) -> int | None:
    """The event-time watermark: no record older than it is expected any more.

    Each partition's own watermark is its largest event time minus the bounded out-of-orderness. The job's
    watermark is the minimum over *active* partitions, because a slow partition may still deliver old
    events. A partition whose last record arrived more than ``idle_timeout_ms`` of wall clock ago is *idle*
    and is left out: otherwise one silent partition (a quiet region, a drained topic) would hold every window
    open forever. This is Flink's ``WatermarkStrategy.withIdleness``; as there, data that an idle partition
    delivers after it wakes up may be late. If every partition is idle, time has still moved on for all of
    them: the watermark is the maximum partition watermark, or (now - idle timeout - out-of-orderness) if
    that is later, so the last window of a stream that goes quiet still closes. A partition without
    ``last_data_wall_ms`` counts as active; partitions that never had data (absent from ``max_event_ms``)
    hold nothing back. None when no partition has had data.

    Never later than ``now - out_of_orderness``, whatever the event times say: ingress accepts times up to
    ``max_skew`` ahead of the wall clock, so without this cap a handful of honest devices whose clocks run
    fast (or one enrolled device that lies) would close the current window early and make every honest set
    still on its way late. Sets from the future wait in their window until the wall clock reaches it.

    The result can move backwards (a partition waking up); callers keep ``max(previous, new)``.
    """
    if out_of_orderness_ms < 0 or idle_timeout_ms < 0:
        raise ValueError("out_of_orderness_ms and idle_timeout_ms must be >= 0")
    if not max_event_ms:
        return None
    marks = {source: int(event) - out_of_orderness_ms for source, event in max_event_ms.items()}
    active = [mark for source, mark in marks.items()
              if source not in last_data_wall_ms or now_ms - last_data_wall_ms[source] <= idle_timeout_ms]
    cap = now_ms - out_of_orderness_ms
    if active:
        return min(min(active), cap)
    # Every partition has been silent for the idle timeout: no device is sending, and whatever it still
    # sends will carry a time near the wall clock, so event time has moved on at least as far as
    # (now - idle timeout - out-of-orderness). Without this the last window of a stream that goes quiet
    # would never close.
    return min(max(max(marks.values()), now_ms - idle_timeout_ms - out_of_orderness_ms), cap)
