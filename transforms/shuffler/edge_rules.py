"""The ingestion edge's rules for a report: what a body must be, what is refused and why, what is forwarded.

The edge (``esa edge``) is the shuffler's front door and inside its trust domain: it is the one component that
sees network metadata (addresses, ports, User-Agents, arrival times), so these rules decide, with no I/O, what
may leave it. A report body is exactly what a device client produces (``transforms.device.client.Client.encode``):
a signed message set sealed whole to the shuffler (``transforms.trust.envelope``). The edge opens the outer layer
only to check the body is one and to learn the claimed device id for rate limiting; the shuffler verifies the
signature against the registry later. What goes to Kafka is the body's own bytes, nothing else: no key, no
header, and a record timestamp rounded down to a whole minute of the edge's clock, so no request time rides
along ("Prochlo: Strong Privacy for Analytics in the Crowd", Bittau et al., 2017: the shuffler strips network
metadata before anything else sees it).

Refusals are RFC 9457 problem details (``application/problem+json``) naming what was wrong with the body, never
who sent it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from schemas import WireFormatError
from transforms.trust.envelope import open_envelopes
from transforms.trust.message_set import decode_message_set
from transforms.trust.sealing import SealError

__all__ = [
    "DEFAULT_MAX_REPORT_BYTES",
    "PROBLEM_CONTENT_TYPE",
    "REPORT_CONTENT_TYPES",
    "TIMESTAMP_GRANULARITY_MS",
    "ForwardedRecord",
    "RefusedError",
    "admit_report",
    "check_content_type",
    "check_declared_length",
    "forwarded_record",
    "problem_body",
]

#: A message set of a multi-message mechanism with many channels stays far below this; one event, one body.
DEFAULT_MAX_REPORT_BYTES = 64 * 1024
REPORT_CONTENT_TYPES = frozenset({"application/octet-stream", "application/vnd.esa.report"})
PROBLEM_CONTENT_TYPE = "application/problem+json"
TIMESTAMP_GRANULARITY_MS = 60_000
_PROBLEM_BASE = "urn:esa:problem:"


class RefusedError(Exception):
    """A request the edge refuses: HTTP ``status``, a problem ``slug`` and ``title``, a ``detail`` about the body
    (never about the sender), and ``retry_after`` seconds for 429 and 503."""

    def __init__(self, status: int, slug: str, title: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(f"{status} {slug}: {detail}")
        self.status, self.slug, self.title, self.detail, self.retry_after = status, slug, title, detail, retry_after


def problem_body(refusal: RefusedError) -> bytes:
    """The RFC 9457 problem details document of a refusal."""
    return json.dumps({"type": _PROBLEM_BASE + refusal.slug, "title": refusal.title, "status": refusal.status,
                       "detail": refusal.detail}, separators=(",", ":")).encode()


def check_content_type(value: str | None, allowed: frozenset[str] = REPORT_CONTENT_TYPES) -> None:
    """415 unless the media type (parameters ignored) is one of ``allowed``."""
    media = (value or "").split(";", 1)[0].strip().lower()
    if media not in allowed:
        raise RefusedError(415, "unsupported-media-type", "Unsupported media type",
                      f"send the body as {' or '.join(sorted(allowed))}, not {media or 'no content type'!r}")


def check_declared_length(declared: int | None, limit: int) -> None:
    """413 before reading a body whose declared Content-Length is over ``limit``."""
    if declared is not None and declared > limit:
        raise RefusedError(413, "too-large", "Body too large", f"{declared} bytes declared; at most {limit} accepted")


def admit_report(body: bytes, sealing_keys: Mapping[str, X25519PrivateKey], limit: int) -> str:
    """The device id a report claims, once the body is known to be one set sealed to a shuffler key this edge
    holds; ``RefusedError`` (400/413) otherwise. The signature is the shuffler's to verify (it holds the registry)."""
    if len(body) > limit:
        raise RefusedError(413, "too-large", "Body too large", f"{len(body)} bytes; at most {limit} accepted")
    if not body:
        raise RefusedError(400, "malformed-report", "Malformed report", "empty body")
    opened = open_envelopes(sealing_keys, [body])[0]
    if isinstance(opened, SealError):
        raise RefusedError(400, "malformed-report", "Malformed report",
                      f"not a message set sealed to a current shuffler key ({opened}); fetch /v1/keys")
    try:
        return decode_message_set(opened).device_id
    except WireFormatError as err:
        raise RefusedError(400, "malformed-report", "Malformed report", f"sealed content is not a message set ({err})"
                      ) from None


@dataclass(frozen=True)
class ForwardedRecord:
    """What the edge writes to the reports topic for one report: no key, no header, a coarse timestamp."""

    value: bytes
    timestamp_ms: int
    key: None = None


def forwarded_record(body: bytes, now_ms: int, granularity_ms: int = TIMESTAMP_GRANULARITY_MS) -> ForwardedRecord:
    """The Kafka record of an admitted body: its bytes verbatim, stamped with the edge's clock rounded down to
    ``granularity_ms`` (Kafka needs a timestamp; the shuffler uses the event time inside the set, never this)."""
    return ForwardedRecord(bytes(body), now_ms - now_ms % granularity_ms)
