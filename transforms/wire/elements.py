"""What travels between the Beam stages before the shuffle: a report with its client, and where a record was read.
"""

from __future__ import annotations

from typing import NamedTuple

from transforms.wire.rows import PayloadRow


class SourceRef(NamedTuple):
    """Where a record was read, so a dead letter can point at it (never forwarded past the shuffler)."""

    topic: str
    partition: int
    offset: int


class ReportElement(NamedTuple):
    """One report (message) on its way into the shuffler (ingress: still carries the client id)."""

    spec_id: str
    channel: int
    client_id: str
    event_time_ms: int
    payload: PayloadRow
    source: SourceRef | None = None
    original: bytes | None = None
    crowd_id: str | None = None
