"""Dead-letter records of a Kafka record that could not be used, kept in the domain that read it.

A dead letter carries where the record was (topic, partition, offset), the stage, the reason and the
original bytes, truncated to ``MAX_ORIGINAL_BYTES`` with a SHA-256 digest of the whole so an oversized
record cannot produce an oversized dead letter. Reasons never name a client or device: the analyst's
side only ever sees counts by stage and reason class.
"""

from __future__ import annotations

from typing import Any

from transforms.kafkaio import KafkaRecord
from transforms.records import SourceRef, dead_letter
from transforms.state.dead_letters import truncate_original


def record_dead_letter(stage: str, reason: str, record: KafkaRecord, spec_id: str | None = None,
                       keep_original: bool = True) -> dict[str, Any]:
    """A DeadLetter record for a Kafka record; ``keep_original=False`` where bytes must not be kept."""
    original, digest = truncate_original(record.value) if keep_original else (None, None)
    out = dead_letter(stage, reason, original=original,
                      source=SourceRef(record.topic, record.partition, record.offset), spec_id=spec_id)
    if digest is not None:
        out["original_digest"] = digest
    return out
