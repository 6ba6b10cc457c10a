"""Planning a bounded read and keeping its offsets: where each partition's range starts and ends, what a
consumer group has committed, and which partitions a producer transaction is still writing.

Split from `transforms.io.kafka.bounded` (the Beam transforms) so each stays readable; every request goes
through `transforms.io.kafka.retry`. Planned ends are last stable offsets: the consumers read committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from transforms.io.kafka import retry
from transforms.io.kafka.clients import Consumer, consumer
from transforms.io.kafka.config import DEFAULT_CLIENT, check_client
from transforms.state.files import StateError

_log = logging.getLogger("transforms.io.kafka.bounded")  # the planner's lines keep the name operators filter on
_NEW_TOPIC_S = 15.0  # how long a topic absent from the metadata is waited for (one just created elsewhere)


class PartitionRange(NamedTuple):
    """Offsets [start, stop) of one partition: the unit of work of a bounded read."""

    topic: str
    partition: int
    start: int
    stop: int


class RewoundLogError(StateError):
    """A partition's log ends before the offset a job resumes from: the topic was deleted and recreated, the
    broker lost its data, or the state belongs to another topic. Reading on from the new end would silently
    skip the new log's first records (and move the resume point backwards), so the job refuses."""


def plan_bounded_read(bootstrap: str, topic: str, group_id: str | None, *,
                      consumer_config: Mapping[str, Any] | None = None,
                      start_offsets: Mapping[int, int] | None = None,
                      client: str = DEFAULT_CLIENT) -> list[PartitionRange]:
    """Per partition: start = ``start_offsets`` (a job's own durable resume point), else the committed
    offset of `group_id`, else the beginning; stop = the end of the log as a read-committed reader sees it (the
    last stable offset: records of a transaction still open are read by a later run, once it has ended)."""
    config = dict(consumer_config or {})
    probe = consumer(client, bootstrap, group_id, **config)
    try:
        partitions = wait_for_partitions(probe, topic, bootstrap)
        begin, ends = probe.offsets(topic, partitions)
    finally:
        probe.close()
    committed: dict[int, int | None] = {}
    if start_offsets:
        committed = {p: start_offsets.get(p) for p in partitions}
    elif group_id is not None:
        grouped = consumer(client, bootstrap, group_id, **config)
        try:
            committed = grouped.committed(topic, partitions)
        finally:
            grouped.close()
    plan, rewound = [], []
    for p in partitions:
        done = committed.get(p)
        start = begin[p] if done is None else max(done, begin[p])
        if done is not None and done < begin[p]:
            _log.error("%s[%d]: %d records (offsets %d to %d) were deleted by the topic's retention before this "
                       "job read them; they are lost to their windows. Keep the retention longer than the job's "
                       "longest stop", topic, p, begin[p] - done, done, begin[p] - 1)
        if start > ends[p]:
            rewound.append(f"{topic}[{p}] resumes at {start}, its log ends at {ends[p]}")
        plan.append(PartitionRange(topic, p, start, ends[p]))
    if rewound:
        raise RewoundLogError(
            f"the log is shorter than what this job has already read ({'; '.join(rewound)}): the topic was deleted "
            "and recreated, the broker lost its data, or the offsets belong to another topic or cluster. Nothing was "
            "read. Reading on from the new end would skip the new log's first records; to read a new log, give it "
            "a new topic name (offsets are kept per topic, and released windows stay released)")
    _log.debug("planned %d records from %s for group %s: %s", sum(r.stop - r.start for r in plan), topic,
              group_id, [(r.partition, r.start, r.stop) for r in plan])
    return plan


class _NotInMetadataError(Exception):
    """The topic is not (yet) in the broker's metadata."""


def wait_for_partitions(probe: Consumer, topic: str, bootstrap: str) -> list[int]:
    """``topic``'s partitions; a topic not in the metadata yet (created a moment ago: UNKNOWN_TOPIC_OR_PARTITION
    until its metadata reaches the broker) is waited for up to 15 s within the retry policy, then refused with
    a ValueError. Short, because a misspelt topic is the common cause and the jobs check names first."""
    def ask() -> list[int]:
        found = probe.partitions(topic)
        if not found:
            raise _NotInMetadataError(f"UNKNOWN_TOPIC_OR_PARTITION: {topic!r} is not in the metadata of {bootstrap}")
        return found

    policy = retry.POLICY
    short = retry.RetryPolicy(min(policy.deadline_s, _NEW_TOPIC_S), policy.first_wait_s, policy.max_wait_s,
                              policy.attempts)
    try:
        return retry.call(f"metadata of {topic}", ask, short, retriable=lambda e: isinstance(e, _NotInMetadataError))
    except retry.KafkaCallError as err:
        if isinstance(err.cause, _NotInMetadataError):
            raise ValueError(f"topic {topic!r} does not exist on {bootstrap}") from None
        raise


def open_transactions(bootstrap: str, plan: Sequence[PartitionRange],
                      consumer_config: Mapping[str, Any] | None = None, *, client: str = DEFAULT_CLIENT) -> list[int]:
    """Partitions of ``plan`` whose log goes on past its planned end (the last stable offset): a producer
    transaction is still open there (or records arrived since). Such a partition is not idle whatever its
    last record's age: a job's watermark must not pass what that transaction may still add (issue 34, K1)."""
    if not plan:
        return []
    key = "isolation.level" if check_client(client) == "confluent" else "isolation_level"
    config = {**dict(consumer_config or {}), key: "read_uncommitted"}
    probe = consumer(client, bootstrap, None, **config)
    try:
        _, ends = probe.offsets(plan[0].topic, [r.partition for r in plan])
    finally:
        probe.close()
    return [r.partition for r in plan if ends.get(r.partition, r.stop) > r.stop]


def committed_offsets(bootstrap: str, group_id: str, topic: str,
                      consumer_config: Mapping[str, Any] | None = None, *,
                      client: str = DEFAULT_CLIENT) -> dict[int, int]:
    """Partition -> offset committed by ``group_id`` on ``topic`` (partitions without a commit are left out)."""
    grouped = consumer(client, bootstrap, group_id, **dict(consumer_config or {}))
    try:
        found = grouped.committed(topic, grouped.partitions(topic))
    finally:
        grouped.close()
    return {p: int(o) for p, o in found.items() if o is not None}


def consumer_lag(bootstrap: str, group_id: str, topic: str, consumer_config: Mapping[str, Any] | None = None,
                 *, client: str = DEFAULT_CLIENT) -> tuple[int, int]:
    """(records committed, records between the group's committed offsets and the log's end), summed over the
    topic's partitions (a partition without a commit counts from its beginning)."""
    config = dict(consumer_config or {})
    grouped = consumer(client, bootstrap, group_id, **config)
    try:
        partitions = grouped.partitions(topic)
        begin, ends = grouped.offsets(topic, partitions)
        committed = grouped.committed(topic, partitions)
    finally:
        grouped.close()
    done = {p: begin[p] if committed.get(p) is None else max(int(committed[p]), begin[p]) for p in partitions}
    return (sum(int(committed[p]) for p in partitions if committed.get(p) is not None),
            sum(max(ends[p] - done[p], 0) for p in partitions))


def commit_plan(bootstrap: str, group_id: str, plan: Iterable[PartitionRange],
                consumer_config: Mapping[str, Any] | None = None, *, client: str = DEFAULT_CLIENT) -> None:
    """Commit `stop` of every range for `group_id`."""
    by_topic: dict[str, dict[int, int]] = {}
    for r in plan:
        by_topic.setdefault(r.topic, {})[r.partition] = r.stop
    grouped = consumer(client, bootstrap, group_id, **dict(consumer_config or {}))
    try:
        for topic, offsets in by_topic.items():
            grouped.commit(topic, offsets)
    finally:
        grouped.close()
    _log.debug("committed %s for group %s", by_topic, group_id)
