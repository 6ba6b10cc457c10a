"""The input-topic preflight talks to the broker as the job does: its client library and its settings.

On the local (plaintext) broker, with each client: a missing topic is refused with the closest name; a TLS
setting makes the check fail (the broker does not speak TLS), while the same settings without it pass, so
the setting did reach the client; a security protocol that cannot work is a config error naming the setting
(kafka-python would otherwise silently connect in plaintext); the jobs pass their own client and settings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pipelines import preflight
from pipelines.exit_codes import ConfigError, ExitCode, KafkaUnavailableError
from pipelines.job import plan_run
from pipelines.job_config import JobConfig
from pipelines.preflight import MissingTopicsError, existing_topics, require_topics
from transforms.io.kafka.bounded import ensure_topics
from transforms.io.kafka.config import CLIENTS

# What a job's --kafka_config also holds: consumer and producer settings an admin client does not take.
JOB_SETTINGS = {"fetch_max_bytes": 1_000_000, "max_partition_fetch_bytes": 1_000_000, "acks": "all",
                "linger_ms": 5, "request_timeout_ms": 4000}


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_require_topics(broker, topic_name: str, client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    require_topics(broker.bootstrap, [topic_name, ""], client=client, kafka_config=JOB_SETTINGS)  # '' = left off
    typo = topic_name[:-1] + "X"
    with pytest.raises(MissingTopicsError) as info:
        require_topics(broker.bootstrap, [topic_name, typo], client=client)
    message = str(info.value)
    assert repr(typo) in message and f"did you mean {topic_name!r}" in message and "existing topics:" in message
    assert info.value.exit_code == ExitCode.KAFKA_UNREACHABLE
    assert typo not in existing_topics(broker.bootstrap, client=client)  # the check created nothing


@pytest.mark.parametrize("client", CLIENTS)
def test_require_topics_on_an_unreachable_broker(client: str) -> None:
    with pytest.raises(KafkaUnavailableError, match=r"127\.0\.0\.1:1"):
        require_topics("127.0.0.1:1", ["t"], timeout_s=2, client=client)


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_the_tls_setting_reaches_the_check(broker, topic_name: str, client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    require_topics(broker.bootstrap, [topic_name], timeout_s=2, client=client, kafka_config=JOB_SETTINGS)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=rf"cannot reach Kafka at {broker.bootstrap} \({client}, "
                                                    r"security[._]protocol SSL\)") as info:
        require_topics(broker.bootstrap, [topic_name], timeout_s=2, client=client,
                       kafka_config={**JOB_SETTINGS, "security_protocol": "SSL"})
    # kafka-python waits forever for a TLS handshake the broker never answers: the check gives up on it after
    # 2 x timeout_s + 1 s (generous slack here for a loaded machine; unguarded, it hung for minutes).
    assert time.monotonic() - started < 15, "the check must not wait much past its deadline"
    assert info.value.exit_code == ExitCode.KAFKA_UNREACHABLE


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("protocol", ["bogus", "ssl-ish"])
def test_a_security_protocol_that_cannot_work_is_a_config_error(broker, client: str, protocol: str) -> None:
    with pytest.raises(ConfigError, match=r"^--kafka_config: ") as info:
        require_topics(broker.bootstrap, ["t"], client=client, kafka_config={"security_protocol": protocol})
    message = str(info.value)
    assert protocol in message and ("security_protocol" in message or '"security.protocol"' in message)
    assert info.value.exit_code == ExitCode.CONFIG


@pytest.mark.parametrize("client", CLIENTS)
def test_the_job_checks_with_its_own_client_and_settings(tmp_path: Path, client: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict[str, Any]] = []

    def no_topics(bootstrap: str, timeout_s: float = 15.0, **kwargs: Any) -> set[str]:
        asked.append(kwargs)
        return set()

    monkeypatch.setattr(preflight, "existing_topics", no_topics)
    settings = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}
    config = JobConfig(bootstrap="b:1", specs=(), out_dir=tmp_path / "out", kafka_client=client,
                       kafka_config=settings)
    with pytest.raises(MissingTopicsError, match="'reports'"):
        plan_run(config.for_stage("shuffle"), "shuffle", "reports")
    assert asked == [{"client": client, "kafka_config": settings}]
