"""Dead-letter records of a Kafka record that could not be used, kept in the domain that read it.

A dead letter carries where the record was (topic, partition, offset), the stage, the reason and the
original bytes, capped by ``transforms.state.dead_letters.bounded_letter`` (a SHA-256 digest stands in
for what was cut), so an oversized record cannot make an oversized dead letter. Reasons never name a
client or device: the analyst's side only ever sees reasons and positions, never bytes.
"""

from __future__ import annotations

from typing import Any

from schemas import SCHEMA_VERSION
from transforms.io.kafka.bounded import KafkaRecord
from transforms.state.dead_letters import bounded_letter, truncate_original
from transforms.wire.elements import SourceRef


def record_dead_letter(stage: str, reason: str, record: KafkaRecord, spec_id: str | None = None,
                       keep_original: bool = True) -> dict[str, Any]:
    """A DeadLetter record for a Kafka record; ``keep_original=False`` where bytes must not be kept."""
    return bounded_letter(dead_letter(stage, reason, original=record.value if keep_original else None,
                                      source=SourceRef(record.topic, record.partition, record.offset),
                                      spec_id=spec_id))


def dead_letter(stage: str, reason: str, *, original: bytes | None = None, source: SourceRef | None = None,
                spec_id: str | None = None) -> dict[str, Any]:
    """A DeadLetter record (schemas/DeadLetter.avsc); the original is capped at 64 KiB (with its full digest)."""
    kept, digest = truncate_original(original)
    return {
        "schema_version": SCHEMA_VERSION,
        "original": kept,
        "topic": source.topic if source else None,
        "partition": source.partition if source else None,
        "offset": source.offset if source else None,
        "stage": stage,
        "reason": reason,
        "spec_id": spec_id,
        "original_length": None if original is None else len(original),
        "original_digest": digest,
    }
