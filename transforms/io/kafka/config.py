"""Kafka client settings: which client library, and kafka-python setting names translated to librdkafka's.

``--kafka_config FILE`` holds kafka-python names (``security_protocol``, ``ssl_cafile`` ...; a dotted key is
read with its dots turned into underscores). The confluent-kafka client (librdkafka) names most of them
differently (``security.protocol``, ``ssl.ca.location`` ...), so the file stays client-neutral and is
translated here; a key without a librdkafka equivalent is refused with a ConfigError naming it, rather than
silently dropped (a dropped TLS setting would be a security bug). librdkafka's own names, written with dots
or underscores (``sasl.mechanisms``, ``ssl_ca_location``), are accepted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONFLUENT = "confluent"
KAFKA_PYTHON = "kafka-python"
CLIENTS = (CONFLUENT, KAFKA_PYTHON)
DEFAULT_CLIENT = CONFLUENT


class KafkaConfigError(ValueError):
    """A Kafka client name or setting that cannot be used (the CLI maps it to a config error, exit 3)."""


# kafka-python name -> librdkafka name. Only settings with the same meaning (and unit) on both sides.
_RENAMED: dict[str, str] = {
    "client_id": "client.id",
    "security_protocol": "security.protocol",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "ssl_crlfile": "ssl.crl.location",
    "ssl_ciphers": "ssl.cipher.suites",
    "sasl_mechanism": "sasl.mechanisms",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "request_timeout_ms": "request.timeout.ms",
    "delivery_timeout_ms": "message.timeout.ms",
    "session_timeout_ms": "session.timeout.ms",
    "heartbeat_interval_ms": "heartbeat.interval.ms",
    "max_poll_interval_ms": "max.poll.interval.ms",
    "enable_auto_commit": "enable.auto.commit",
    "auto_offset_reset": "auto.offset.reset",
    "fetch_max_wait_ms": "fetch.wait.max.ms",
    "fetch_min_bytes": "fetch.min.bytes",
    "fetch_max_bytes": "fetch.max.bytes",
    "max_partition_fetch_bytes": "max.partition.fetch.bytes",
    "isolation_level": "isolation.level",
    "check_crcs": "check.crcs",
    "acks": "acks",
    "linger_ms": "linger.ms",
    "batch_size": "batch.size",
    "compression_type": "compression.type",
    "retries": "retries",
    "retry_backoff_ms": "retry.backoff.ms",
    "max_in_flight_requests_per_connection": "max.in.flight.requests.per.connection",
    "enable_idempotence": "enable.idempotence",
    "max_request_size": "message.max.bytes",
    "reconnect_backoff_ms": "reconnect.backoff.ms",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "connections_max_idle_ms": "connections.max.idle.ms",
    "metadata_max_age_ms": "metadata.max.age.ms",
    "receive_buffer_bytes": "socket.receive.buffer.bytes",
    "send_buffer_bytes": "socket.send.buffer.bytes",
}
# librdkafka names given with underscores (the config file reader turns dots into underscores).
_NATIVE: dict[str, str] = {name.replace(".", "_"): name for name in _RENAMED.values()}
_NATIVE.update({name.replace(".", "_"): name for name in (
    "ssl.endpoint.identification.algorithm", "ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem",
    "sasl.oauthbearer.config", "sasl.oauthbearer.method", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope",
    "queued.max.messages.kbytes", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "socket.timeout.ms", "message.timeout.ms", "batch.num.messages", "statistics.interval.ms", "debug")})


def check_client(name: str) -> str:
    """``name`` if it is a supported client, else a KafkaConfigError listing the choices."""
    if name not in CLIENTS:
        raise KafkaConfigError(f"unknown Kafka client {name!r}; use one of {', '.join(CLIENTS)}")
    return name


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise KafkaConfigError(f"ssl_check_hostname: expected true or false, got {value!r}")


def to_librdkafka(config: Mapping[str, Any]) -> dict[str, Any]:
    """Translate kafka-python settings (or librdkafka ones) to librdkafka names; KafkaConfigError on a key
    with no equivalent."""
    out: dict[str, Any] = {}
    unknown = []
    for key, value in config.items():
        if "." in key:  # already a librdkafka name
            out[key] = value
        elif key == "ssl_check_hostname":  # a boolean in kafka-python, an algorithm name in librdkafka
            out["ssl.endpoint.identification.algorithm"] = "https" if _flag(value) else "none"
        elif key in _RENAMED:
            out[_RENAMED[key]] = value
        elif key in _NATIVE:
            out[_NATIVE[key]] = value
        else:
            unknown.append(key)
    if unknown:
        raise KafkaConfigError(
            f"Kafka setting(s) {', '.join(sorted(unknown))} have no confluent-kafka (librdkafka) equivalent; "
            f"remove them or use --kafka_client {KAFKA_PYTHON} (docs/operations.md lists the translated keys)")
    for key in ("acks",):  # librdkafka wants strings for enumerations that kafka-python accepts as ints
        if key in out and not isinstance(out[key], str):
            out[key] = str(out[key])
    return out


def validate(client: str, config: Mapping[str, Any]) -> None:
    """Fail now, at option parsing, rather than inside a running pipeline."""
    if check_client(client) == CONFLUENT:
        to_librdkafka(config)
