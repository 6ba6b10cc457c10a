"""How widely a bounded shuffle run spreads its work (``ScaleOut``) and which windows it closes (``WindowClock``).

Both are decided by the driver before the pipeline is built, from what the run planned to read and what
earlier runs saw, so every worker of the run agrees on them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from transforms.spec import AnalysisSpec
from transforms.state.run_state import watermark_ms

RECORDS_PER_BUCKET = 20_000  # a dedupe group (Python objects on one worker) of about this many sets
RECORDS_PER_SUBKEY = 250_000  # a sub-crowd (delete-and-permute on one worker) of about this many sets
MAX_BUCKETS = 65_536
MAX_SUBKEYS = 4096  # the spec's own bound on [crowd] subkeys


def _pow2_at_least(x: float) -> int:
    return 1 << max(math.ceil(math.log2(x)), 0) if x > 1 else 1


@dataclass(frozen=True)
class ScaleOut:
    """How widely one run spreads its work, derived from the records it planned to read.

    ``buckets``: device-hash buckets per (crowd, window) for dedupe, so each dedupe group stays near
    ``RECORDS_PER_BUCKET`` sets even when a whole run is one window; a distributed runner spreads groups over
    workers. Releases do not depend on it (units are put in rank order), so any run may pick any value. A small
    run gets few buckets (one below ``RECORDS_PER_BUCKET`` records): ingress packs, and dedupe handles, every
    (window, bucket) of a batch apart, each paying numpy's per-call overhead, so 64 buckets for a run of 100,000
    sets (the former floor) cost more CPU per set than the packing and the dedupe themselves.
    ``subkeys(spec)``: sub-keys per crowd, at least the spec's ``[crowd] subkeys``, more for a run above
    ``RECORDS_PER_SUBKEY`` sets per spec sub-key, so no worker holds more than a bounded slice of a crowd.
    The sub-key count is part of a release (deletions are allotted per sub-crowd), hence powers of two: a
    rerun of a crashed attempt that plans a little more data keeps the same count; one that crosses a power
    of two produces a different release, which the ledger refuses (the sealed one is republished).
    """
    records: int

    @property
    def buckets(self) -> int:
        return min(_pow2_at_least(self.records / RECORDS_PER_BUCKET), MAX_BUCKETS)

    def subkeys(self, spec: AnalysisSpec) -> int:
        derived = _pow2_at_least(self.records / RECORDS_PER_SUBKEY)
        return min(max(derived, spec.crowd.subkeys), max(MAX_SUBKEYS, spec.crowd.subkeys))


@dataclass(frozen=True)
class WindowClock:
    """Decides which windows are closed in this run: window end + allowed lateness <= watermark.

    The watermark is min over active partitions of (max authenticated event time - out-of-orderness),
    over this run's records and what earlier runs saw (``state.run_state.watermark_ms``); ``drain``
    closes every window (end of a bounded backfill, or an operator's explicit drain).
    """
    now_ms: int
    out_of_orderness_ms: int
    idle_timeout_ms: int
    prior_max_event_ms: Mapping[str, int] = field(default_factory=dict)
    prior_last_data_wall_ms: Mapping[str, int] = field(default_factory=dict)
    drain: bool = False

    def watermark(self, run_max_event_ms: Mapping[str, int]) -> int | None:
        if self.drain:
            return None
        max_event = dict(self.prior_max_event_ms)
        last_wall = dict(self.prior_last_data_wall_ms)
        for pkey, event_ms in run_max_event_ms.items():
            max_event[pkey] = max(max_event.get(pkey, event_ms), event_ms)
            last_wall[pkey] = self.now_ms
        return watermark_ms(max_event, last_wall, self.now_ms, self.out_of_orderness_ms, self.idle_timeout_ms)

    def closed(self, window_end_ms: int, lateness_ms: int, watermark: int | None) -> bool:
        return self.drain or (watermark is not None and window_end_ms + lateness_ms <= watermark)
