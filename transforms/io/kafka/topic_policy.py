"""Refuse topics whose cleanup policy or retention can drop records a job has not read yet.

Why: every message set is keyed by its device id (one device's sets stay in order in one partition), so a
*compacted* reports topic keeps only each device's newest set: an adversarial run lost 200 of 400 sets that
way, silently. Deletion by time or size loses records the same way when a job falls behind. The rule, for
every topic a job reads or writes (its input, its outputs, its dead-letter topic):

* ``cleanup.policy`` must not include ``compact``;
* ``retention.ms`` must be -1 (keep forever) or at least `MIN_RETENTION_MS` (24 h: a job stopped overnight, or
  a ``--follow`` job waiting out a long broker outage, still finds its records; shorter retention is a
  topic built to lose them). Between 24 h and the stop that outlives it, the planner still logs, loudly, what
  retention deleted before it was read (``plan_bounded_read``);
* ``retention.bytes`` must be -1: a size bound drops the oldest records whenever a burst fills it, whatever
  the jobs' pace.

Topics that are compacted by design and read by no job that counts on every record (the device registry's
``devices`` topic: one enrolment per device id, the newest wins) are exempt by name: `EXEMPT`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from transforms.io.kafka import retry
from transforms.io.kafka.config import KafkaConfigError, to_librdkafka

__all__ = ["EXEMPT", "MIN_RETENTION_MS", "UnsafeTopicError", "check_topics", "unsafe_reasons"]

LOG = logging.getLogger(__name__)
MIN_RETENTION_MS = 24 * 3600 * 1000
#: compacted on purpose (the newest record per key is the state); no job reads them as a stream of records
EXEMPT = frozenset({"devices"})
_TIMEOUT_S = 15.0


class UnsafeTopicError(retry.KafkaCallError):
    """A topic's cleanup policy or retention can drop unread records (exit 4, before anything is read)."""


def unsafe_reasons(topic: str, settings: Mapping[str, str]) -> list[str]:
    """Why ``settings`` (a topic's effective configuration) can drop records a job has not read; [] if none."""
    reasons = []
    policy = {p.strip() for p in str(settings.get("cleanup.policy", "delete")).split(",")}
    if "compact" in policy:
        reasons.append("cleanup.policy=compact keeps only the newest record per key (every set is keyed by its "
                       "device id)")
    if "delete" in policy:
        retention_ms = int(settings.get("retention.ms", "-1"))
        if 0 <= retention_ms < MIN_RETENTION_MS:
            reasons.append(f"retention.ms={retention_ms} deletes records after {retention_ms / 3_600_000:.3g} h, "
                           f"less than the {MIN_RETENTION_MS // 3_600_000} h a job may be stopped")
        retention_bytes = int(settings.get("retention.bytes", "-1"))
        if retention_bytes >= 0:
            reasons.append(f"retention.bytes={retention_bytes} deletes the oldest records whenever a burst fills it")
    return reasons


def _describe(bootstrap: str, topics: list[str], config: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    settings = {k: v for k, v in to_librdkafka(config).items()
                if k.startswith(("security.", "ssl.", "sasl.", "socket.", "client."))}
    admin = AdminClient({"bootstrap.servers": bootstrap, **settings})
    wanted = ("cleanup.policy", "retention.ms", "retention.bytes")

    def ask() -> dict[str, dict[str, str]]:
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                         request_timeout=_TIMEOUT_S)
        return {resource.name: {k: str(e.value) for k, e in future.result(_TIMEOUT_S + 5).items() if k in wanted}
                for resource, future in futures.items()}

    return retry.call(f"configuration of {', '.join(topics)}", ask)


def check_topics(bootstrap: str, topics: Iterable[str | None], config: Mapping[str, Any] | None = None,
                 exempt: frozenset[str] = EXEMPT) -> None:
    """UnsafeTopicError naming the first topic (and why) whose settings can drop unread records.

    A principal without DescribeConfigs on a topic (the ACLs of ``pipelines.broker.acls`` grant it) cannot
    tell: that is logged as a warning and the job goes on, as it did before this check existed."""
    names = [t for t in dict.fromkeys(t for t in topics if t) if t not in exempt]
    if not names:
        return
    try:
        described = _describe(bootstrap, names, dict(config or {}))
    except KafkaConfigError:  # settings only kafka-python understands: checked where confluent can connect
        LOG.warning("cannot check the cleanup policy of %s with these Kafka settings", ", ".join(names))
        return
    except retry.KafkaCallError as err:
        if "AUTHORIZATION" in str(err).upper():
            LOG.warning("cannot check the cleanup policy and retention of %s (not authorized to describe their "
                        "configuration: grant DescribeConfigs); make sure they are not compacted", ", ".join(names))
            return
        raise
    for topic in names:
        reasons = unsafe_reasons(topic, described.get(topic, {}))
        if reasons:
            raise UnsafeTopicError(
                f"topic {topic!r} can drop records before they are read: {'; '.join(reasons)}. Refusing to use it "
                f"(nothing was read or written). Use a topic with cleanup.policy=delete, retention.ms=-1 or at least "
                f"{MIN_RETENTION_MS // 3_600_000} h, and retention.bytes=-1 (kafka-configs.sh --alter --entity-type "
                f"topics --entity-name {topic} --add-config ...)")
