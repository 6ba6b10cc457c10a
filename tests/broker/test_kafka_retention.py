"""Records that retention deleted before a job read them are reported with their count and offsets.

Real retention on the real broker: a topic whose segments roll after 1 s and are deleted 1 s after their
newest record, on a broker that checks retention every 500 ms. A consumer group committed offset 0 before;
by the time the job plans its read, the log starts later, and the planner says how many records of which
offsets are gone (they are lost to their windows; the job reads on from the new log start).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.broker import LocalBroker
from transforms.io.kafka.bounded import PartitionRange, commit_plan, plan_bounded_read, produce_records

pytestmark = pytest.mark.slow


def test_records_deleted_by_retention_are_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    props = {"log.retention.check.interval.ms": "500", "log.segment.delete.delay.ms": "0"}
    with LocalBroker(data_dir=tmp_path, properties=props) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic = NewTopic("short-lived", 1, 1, config={"retention.ms": "1000", "segment.ms": "1000"})
        admin.create_topics([topic])["short-lived"].result(30)
        commit_plan(broker.bootstrap, "late-job", [PartitionRange("short-lived", 0, 0, 0)])
        produce_records(broker.bootstrap, "short-lived", [b"old-%d" % i for i in range(100)])
        time.sleep(1.5)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            produce_records(broker.bootstrap, "short-lived", [b"new"])  # rolls the segment of the old records
            with caplog.at_level(logging.ERROR, logger="transforms.io.kafka.bounded"):
                plan = plan_bounded_read(broker.bootstrap, "short-lived", "late-job")
            if plan[0].start > 0:
                break
            time.sleep(0.5)
        (r,) = plan
        assert r.start >= 100, "retention never deleted the old segment"
        lost = [rec.getMessage() for rec in caplog.records if "deleted by the topic's retention" in rec.getMessage()]
        assert lost and lost[-1].startswith(f"short-lived[0]: {r.start} records (offsets 0 to {r.start - 1})")
