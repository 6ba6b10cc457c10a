"""What the shuffler's stages hand each other: an authenticated message set, its time policy, output tags.

Kept apart from the stages so that dedupe, threshold, spill and the streaming graph share these few names
without importing the ingress step (and so without import circles).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import NamedTuple

from transforms.wire.elements import SourceRef

NAMESPACE = "esa"
DEAD = "dead_letters"
TIMES = "event_times"
VERIFIED = "verified_sets"
DEDUPE_BUCKETS = 64  # device-hash buckets per (crowd, window): duplicates of one device always meet


class SetElement(NamedTuple):
    """An authenticated message set inside the shuffler: routing fields, sealed messages, where it was read."""

    spec_id: str
    crowd_id: str | None
    device_id: str
    event_time_ms: int
    window_end_ms: int
    digest: bytes  # SHA-256 of what the device signed: every copy (replay, resend, re-encoding) shares it
    messages: tuple[tuple[int, bytes], ...]  # (channel, sealed payload)
    source: SourceRef


@dataclass(frozen=True)
class TimePolicy:
    """Event-time bounds at ingress, fixed once per run so every worker (and a retry) agrees."""

    now_ms: int
    max_age_ms: int
    max_skew_ms: int

    def problem(self, event_time_ms: int, now_ms: int | None = None) -> str | None:
        now = self.now_ms if now_ms is None else now_ms
        if event_time_ms < now - self.max_age_ms:
            return f"stale: event time more than {self.max_age_ms // 1000} s before the run started"
        if event_time_ms > now + self.max_skew_ms:
            return f"from the future: event time more than {self.max_skew_ms // 1000} s after the run started"
        return None


def window_end_of(event_time_ms: int, window_ms: int) -> int:
    return (event_time_ms // window_ms + 1) * window_ms


def device_bucket(device_id: str, buckets: int = DEDUPE_BUCKETS) -> int:
    """Stable bucket of a device (CRC-32: identical on every worker, unlike Python's salted ``hash``)."""
    return zlib.crc32(device_id.encode("ascii", "replace")) % buckets
