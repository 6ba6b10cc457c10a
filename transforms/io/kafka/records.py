"""What both Kafka clients share: the record, the produced element, the errors (`transforms.io.kafka.clients`)."""

from __future__ import annotations

from typing import NamedTuple

from transforms.io.kafka.retry import KafkaCallError

CLIENT_ID = "esa-telemetry"
MAX_RECORDS = 100_000  # per poll: few large polls (kafka-python's default is 500)


Element = bytes | tuple[bytes | None, bytes]


def split_element(element: Element) -> tuple[bytes | None, bytes]:
    """(key, value) of a produced element: ``bytes`` (no key) or a ``(key, value)`` tuple."""
    if isinstance(element, tuple):
        key, value = element
        return key, value
    if isinstance(element, bytes | bytearray):
        return None, bytes(element)
    raise TypeError(f"Kafka elements must be bytes or (key, value) tuples, got {type(element).__name__}")


class KafkaRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes


class KafkaReadError(KafkaCallError):
    """A bounded read made no progress (broker gone, records deleted under us)."""


class KafkaWriteError(KafkaCallError):
    """The broker refused or timed out a produced record."""
