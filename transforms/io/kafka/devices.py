"""The devices topic on Kafka: created compacted, written by enrolment, read incrementally by the shuffler.

The record format is ``transforms.trust.enrolment`` (pure); this module only moves records. Why compacted:
the topic is the registry itself, keyed by device id, so Kafka keeps the newest record per device forever
(a delete policy would drop enrolments after the retention time) and a re-enrolment adds nothing for long.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from transforms.io.kafka.bounded import (
    PartitionRange,
    _read_range,
    plan_bounded_read,
    produce_records,
)
from transforms.io.kafka.clients import CLIENT_ID, KafkaRecord, consumer
from transforms.io.kafka.config import CONFLUENT, DEFAULT_CLIENT, check_client, to_librdkafka
from transforms.io.kafka.kafka_python import _ADMIN_KEYS
from transforms.io.kafka.retry import KafkaCallError
from transforms.trust.enrolment import enrolment_record

__all__ = ["COMPACTED", "devices_topic_exists", "ensure_devices_topic", "produce_enrolments", "read_devices"]

#: the devices topic's settings: compacted, never deleted by time; a revocation (tombstone) is kept 30 days
#: before compaction may drop it, so a shuffler stopped for less than that still reads it
COMPACTED = {"cleanup.policy": "compact", "retention.ms": "-1", "delete.retention.ms": str(30 * 86_400_000)}
_TIMEOUT_S = 30.0


def ensure_devices_topic(bootstrap: str, topic: str, *, partitions: int = 1,
                         client_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT) -> None:
    """Create ``topic`` compacted if it is missing; an existing topic is left as it is."""
    config = dict(client_config or {})
    if check_client(client) == CONFLUENT:
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import AdminClient, NewTopic

        settings = {"bootstrap.servers": bootstrap, "client.id": CLIENT_ID}
        settings.update({k: v for k, v in to_librdkafka(config).items()
                         if k.startswith(("security.", "ssl.", "sasl.", "socket.", "client."))})
        admin = AdminClient(settings)
        future = admin.create_topics([NewTopic(topic, partitions, 1, config=dict(COMPACTED))],
                                     operation_timeout=_TIMEOUT_S, request_timeout=_TIMEOUT_S)[topic]
        try:
            future.result(timeout=_TIMEOUT_S + 5)
        except Exception as exc:
            err = exc.args[0] if exc.args else None
            if getattr(err, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaCallError(f"cannot create the devices topic {topic!r} on {bootstrap}: {exc}", exc) from exc
        deadline = time.monotonic() + _TIMEOUT_S  # until the metadata shows it (kafka-python: wait_for_metadata)
        while topic not in admin.list_topics(timeout=_TIMEOUT_S).topics:
            if time.monotonic() > deadline:
                raise KafkaCallError(f"the devices topic {topic!r} was created but does not appear on {bootstrap}")
            time.sleep(0.1)
    else:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        settings = {"client_id": CLIENT_ID} | {k: v for k, v in config.items() if k.startswith(_ADMIN_KEYS)}
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **settings)
        try:
            response = admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=dict(COMPACTED))],
                                           raise_errors=False, wait_for_metadata=True)
            for result in response.get("topics", []):
                if result["error_code"] not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                    raise KafkaCallError(f"cannot create the devices topic {topic!r} on {bootstrap}: "
                                         f"{result.get('error_message')}")
        finally:
            admin.close()


def devices_topic_exists(bootstrap: str, topic: str, *, client_config: Mapping[str, Any] | None = None,
                         client: str = DEFAULT_CLIENT) -> bool:
    probe = consumer(client, bootstrap, **dict(client_config or {}))
    try:
        return bool(probe.partitions(topic))
    finally:
        probe.close()


def produce_enrolments(bootstrap: str, topic: str, public_keys: Iterable[bytes], *,
                       producer_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT,
                       create: bool = True) -> int:
    """Enrol raw Ed25519 public keys: every key is checked first (one bad key: ``ValueError``, nothing written),
    then written as enrolment records (acks=all); returns the number of records acknowledged."""
    records = [enrolment_record(key) for key in public_keys]
    if create:
        ensure_devices_topic(bootstrap, topic, client_config=producer_config, client=client)
    return produce_records(bootstrap, topic, records, producer_config=producer_config, client=client)


def read_devices(bootstrap: str, topic: str, start_offsets: Mapping[int, int], *,
                 consumer_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT,
                 stall_timeout_s: float = 60.0) -> tuple[list[PartitionRange], Iterator[list[KafkaRecord]]]:
    """(the plan, its record batches): per partition, from ``start_offsets`` (else the beginning) to the end of
    the log at this call. Offsets a compaction removed are gaps, skipped; a partition whose log starts past the
    stored offset (records deleted, impossible under compaction unless the topic was recreated) reads on from
    the log start, as a bounded read does. Raises ``ValueError`` if the topic does not exist."""
    config = dict(consumer_config or {})
    plan = plan_bounded_read(bootstrap, topic, None, consumer_config=config, start_offsets=dict(start_offsets),
                             client=client)

    def batches() -> Iterator[list[KafkaRecord]]:
        reader = consumer(client, bootstrap, **config)
        try:
            for r in plan:
                yield from _read_range(reader, r, stall_timeout_s)
        finally:
            reader.close()

    return plan, batches()

