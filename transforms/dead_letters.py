"""Dead-letter records of a Kafka record that could not be used, kept in the domain that read it.

A dead letter carries where the record was (topic, partition, offset), the stage, the reason and the
original bytes, capped by ``transforms.state.dead_letters.bounded_letter`` (a SHA-256 digest stands in
for what was cut), so an oversized record cannot make an oversized dead letter. Reasons never name a
client or device: the analyst's side only ever sees reasons and positions, never bytes.
"""

from __future__ import annotations

from typing import Any

from transforms.kafkaio import KafkaRecord
from transforms.records import SourceRef, dead_letter
from transforms.state.dead_letters import bounded_letter


def record_dead_letter(stage: str, reason: str, record: KafkaRecord, spec_id: str | None = None,
                       keep_original: bool = True) -> dict[str, Any]:
    """A DeadLetter record for a Kafka record; ``keep_original=False`` where bytes must not be kept."""
    return bounded_letter(dead_letter(stage, reason, original=record.value if keep_original else None,
                                      source=SourceRef(record.topic, record.partition, record.offset),
                                      spec_id=spec_id))
