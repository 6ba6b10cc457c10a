"""Issue 34, N1: a topic whose cleanup policy or retention can drop unread records is refused in one line with
exit 4, before anything is read or written (`transforms.io.kafka.topic_policy`), on the real broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines import encode, shuffle
from pipelines.broker import LocalBroker
from pipelines.cli import _error_code
from pipelines.exit_codes import ExitCode
from pipelines.job_config import JobConfig
from transforms.io.kafka.bounded import ensure_topics, produce_records
from transforms.io.kafka.topic_policy import (
    EXEMPT,
    MIN_RETENTION_MS,
    UnsafeTopicError,
    check_topics,
    unsafe_reasons,
)
from transforms.spec import load_spec

SPEC = Path(__file__).resolve().parents[2] / "examples" / "feature_usage.toml"
DAY_MS = 24 * 3600 * 1000


def test_the_rule() -> None:
    assert unsafe_reasons("t", {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS),
                                "retention.bytes": "-1"}) == []  # Kafka's defaults
    assert unsafe_reasons("t", {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}) == []
    assert unsafe_reasons("t", {"cleanup.policy": "delete", "retention.ms": str(MIN_RETENTION_MS)}) == []
    assert "compact" in unsafe_reasons("t", {"cleanup.policy": "compact"})[0]
    assert len(unsafe_reasons("t", {"cleanup.policy": "compact,delete", "retention.ms": "1000"})) == 2
    assert "retention.ms=3600000" in unsafe_reasons("t", {"cleanup.policy": "delete", "retention.ms": "3600000"})[0]
    assert "retention.bytes" in unsafe_reasons("t", {"cleanup.policy": "delete", "retention.bytes": "1048576"})[0]
    assert "devices" in EXEMPT  # the registry's enrolments: compacted by design, read by no job as a stream


def _topic(broker: LocalBroker, name: str, **config: str) -> str:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1, config=config)])[name].result(60)
    return name


def _config(broker: LocalBroker, tmp_path: Path, **topics: str) -> JobConfig:
    return JobConfig(bootstrap=broker.bootstrap, specs=(load_spec(str(SPEC)),), out_dir=tmp_path / "out",
                     state_dir=tmp_path / "state", keys_dir=tmp_path / "keys", seed=7, drain=True,
                     group_id=f"g-{tmp_path.name}", **topics)


def test_a_compacted_reports_topic_is_refused_before_anything_is_read(
        broker: LocalBroker, topic_name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reports = _topic(broker, f"{topic_name}-reports", **{"cleanup.policy": "compact"})
    shuffled = f"{topic_name}-shuffled"
    ensure_topics(broker.bootstrap, [shuffled], partitions=2)
    produce_records(broker.bootstrap, reports, [(b"device-1", b"set-%d" % i) for i in range(10)])
    config = _config(broker, tmp_path, reports_topic=reports, shuffled_topic=shuffled)
    with pytest.raises(UnsafeTopicError, match=r"cleanup\.policy=compact") as refused:
        shuffle.run(config)
    assert not (tmp_path / "state" / "run_state.json").exists()  # no run was planned, nothing read
    capsys.readouterr()
    assert _error_code("shuffle", refused.value) == ExitCode.KAFKA_UNREACHABLE == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reports in err and "Traceback" not in err


def test_an_encoder_output_with_short_retention_is_refused(broker: LocalBroker, topic_name: str,
                                                           tmp_path: Path) -> None:
    raw = _topic(broker, f"{topic_name}-raw")
    reports = _topic(broker, f"{topic_name}-reports", **{"retention.ms": str(3600_000)})
    config = _config(broker, tmp_path, raw_topic=raw, reports_topic=reports)
    with pytest.raises(UnsafeTopicError, match=r"retention\.ms=3600000"):
        encode.run(config)


def test_a_size_bound_input_is_refused_and_safe_topics_pass(broker: LocalBroker, topic_name: str) -> None:
    bounded = _topic(broker, f"{topic_name}-bytes", **{"retention.bytes": "10485760"})
    with pytest.raises(UnsafeTopicError, match=r"retention\.bytes=10485760"):
        check_topics(broker.bootstrap, [bounded])
    plain = _topic(broker, f"{topic_name}-plain")
    forever = _topic(broker, f"{topic_name}-forever", **{"retention.ms": "-1"})
    check_topics(broker.bootstrap, [plain, forever, None])  # the broker's defaults (7 days) and keep-forever


def test_a_topic_compacted_by_design_is_exempt_by_name(broker: LocalBroker, topic_name: str) -> None:
    """As the registry's ``devices`` topic is (``EXEMPT``): its own name here, the session broker is shared."""
    registry = _topic(broker, f"{topic_name}-devices", **{"cleanup.policy": "compact"})
    check_topics(broker.bootstrap, [registry], exempt=EXEMPT | {registry})
    with pytest.raises(UnsafeTopicError):
        check_topics(broker.bootstrap, [registry])
