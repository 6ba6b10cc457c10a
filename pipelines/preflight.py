"""Checks a job makes before it starts: the broker answers, the topics it reads exist and so do the topics
it writes (unless ``--create_topics``), each dead letter going to its own domain's topic.

Reading a topic that does not exist would auto-create it (or wait forever) and a typo such as
``--shuffled_topic shufled`` would then run a job over nothing; :func:`require_topics` refuses instead and
lists the topics the broker does have. The check talks to the broker as the job will: with the job's Kafka
client library (``--kafka_client``) and its settings (``--kafka_config``: TLS, SASL), so a broker the job
cannot reach, or a setting that cannot work, fails here, in one line, before any state is touched.
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from pipelines.exit_codes import ConfigError, KafkaUnavailableError
from transforms.io.kafka.config import CONFLUENT, DEFAULT_CLIENT, KafkaConfigError, check_client, to_librdkafka

LOG = logging.getLogger(__name__)
CLIENT_ID = "esa-preflight"
#: the values kafka-python understands; it reads any other (``ssl``, ``TLS``) as PLAINTEXT, without a word
KP_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# librdkafka connection settings an admin client takes (the job's config also holds consumer and producer
# settings, which an admin client would ignore with a warning each); kafka-python's: its DEFAULT_CONFIG keys.
_RD_ADMIN = ("security.", "ssl.", "sasl.", "socket.", "client.", "reconnect.", "metadata.", "debug")
T = TypeVar("T")


class MissingTopicsError(KafkaUnavailableError):
    """Input topics that do not exist on the broker."""


#: the job of each trust domain: its dead letters go to ``<--dead_letter_topic>-<job>``, never beside another's
#: (``dead-letters`` gives ``dead-letters-encode``, ``-shuffle``, ``-analyze``: the ACLs' names, pipelines.broker.acls)
DOMAIN_JOBS = ("encode", "shuffle", "analyze")


def domain_dead_letter_topic(prefix: str | None, stage: str) -> str | None:
    """The dead-letter topic of ``stage``'s trust domain, or None when dead letters are not published.

    One topic per domain, whatever the operator passes: ``esa run`` gives its three jobs one flag, and an
    encoder's or shuffler's letters hold raw bytes (client ids, exact times, values) that the analyzer's
    principal must never be able to read; per-domain names let the broker's ACLs keep them apart."""
    if stage not in DOMAIN_JOBS:
        raise ValueError(f"no trust domain for stage {stage!r}")
    return f"{prefix}-{stage}" if prefix else None


def publishable(stage: str, letters: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    """What ``stage`` may publish of its dead letters: the analyzer's keep their reasons and positions and
    lose any original bytes (a release's ciphertexts are the shuffler's output, not the analyst's to keep)."""
    if stage != "analyze":
        return letters
    return ({**letter, "original": None, "original_digest": None} for letter in letters)


class TopicAuthorizationError(KafkaUnavailableError):
    """Topics the broker's ACLs do not let this job's principal see (exit 4, as an unreachable broker)."""


_TOPIC_AUTHORIZATION_FAILED = 29  # Kafka's error code, the same through both clients


def existing_topics(bootstrap: str, timeout_s: float = 15.0, *, client: str = DEFAULT_CLIENT,
                    kafka_config: Mapping[str, Any] | None = None) -> set[str]:
    """The topic names the broker knows (internal ``__`` topics left out), asked with ``client`` and the
    connection settings of ``kafka_config`` (kafka-python names, as ``--kafka_config`` holds them).

    ConfigError (exit 3) naming the setting when a setting cannot work; KafkaUnavailableError (exit 4) when
    the broker cannot be reached (or spoken to with these settings) within about ``timeout_s``."""
    config = dict(kafka_config or {})
    try:
        lister = _confluent_lister(bootstrap, config, timeout_s) if check_client(client) == CONFLUENT \
            else _kafka_python_lister(bootstrap, config, timeout_s)
    except KafkaConfigError as err:
        raise ConfigError(f"--kafka_config: {err}") from None
    where = f"Kafka at {bootstrap} ({client}, security_protocol {config.get('security_protocol', 'PLAINTEXT')})"
    deadline_s = 2 * timeout_s + 1  # connecting, then listing, each within timeout_s
    names = _within(lister, deadline_s, f"cannot reach {where}: no answer within {deadline_s:g} s")
    return {t for t in names if not t.startswith("__")}


def _kafka_python_lister(bootstrap: str, config: dict[str, Any], timeout_s: float) -> Callable[[], list[str]]:
    protocol = config.get("security_protocol", "PLAINTEXT")
    if protocol not in KP_SECURITY_PROTOCOLS:
        raise KafkaConfigError(f"security_protocol {protocol!r} is not one of {', '.join(KP_SECURITY_PROTOCOLS)} "
                               "(kafka-python would connect in PLAINTEXT)")
    from kafka import KafkaAdminClient

    timeout_ms = int(timeout_s * 1000)
    settings = {"client_id": CLIENT_ID, "request_timeout_ms": timeout_ms, "bootstrap_timeout_ms": timeout_ms}
    settings.update({k: v for k, v in config.items() if k in KafkaAdminClient.DEFAULT_CONFIG})

    def names() -> list[str]:
        from kafka.errors import KafkaConfigurationError, KafkaError

        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, **settings)
        except (KafkaConfigurationError, TypeError) as err:
            raise ConfigError(f"--kafka_config: kafka-python refuses the settings: {err}") from None
        except (KafkaError, OSError, ValueError) as err:
            raise KafkaUnavailableError(f"cannot reach Kafka at {bootstrap} (kafka-python, security_protocol "
                                        f"{settings.get('security_protocol', 'PLAINTEXT')}): {err}") from None
        try:
            return list(admin.list_topics())
        except (KafkaError, OSError) as err:
            raise KafkaUnavailableError(f"cannot list the topics of Kafka at {bootstrap}: {err}") from None
        finally:
            admin.close()

    return names


def _confluent_lister(bootstrap: str, config: dict[str, Any], timeout_s: float) -> Callable[[], list[str]]:
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "client.id": CLIENT_ID,
                                "logger": logging.getLogger("kafka.librdkafka"),
                                "log_level": 0}  # the failure is summarized in one line: no per-connection logs
    settings.update({k: v for k, v in to_librdkafka(config).items() if k.startswith(_RD_ADMIN)})

    def names() -> list[str]:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient

        # librdkafka reports why a connection failed (authentication, TLS handshake) to the error callback and
        # only "transport failure" to the call: keep the first such cause for the one-line message.
        causes: list[KafkaError] = []
        try:
            admin = AdminClient({**settings, "error_cb": causes.append})
        except KafkaException as err:  # librdkafka checks every value here: the message names the property
            raise ConfigError(f"--kafka_config: {_reason(err)}") from None
        deadline = time.monotonic() + timeout_s
        while True:  # short asks, so that a refused connection or handshake ends the wait at once
            try:
                return list(admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic()))).topics)
            except KafkaException as err:
                code = err.args[0].code() if err.args and isinstance(err.args[0], KafkaError) else None
                if code == KafkaError._INVALID_ARG:
                    raise ConfigError(f"--kafka_config: {_reason(err)}") from None
                admin.poll(0)  # serves the error callback
                telling = [c for c in causes if c.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL)]
                down = any(c.code() == KafkaError._ALL_BROKERS_DOWN for c in causes)
                if telling or down or time.monotonic() >= deadline:
                    reason = telling[0].str() if telling else _reason(err)
                    raise KafkaUnavailableError(
                        f"cannot reach Kafka at {bootstrap} (confluent, security.protocol "
                        f"{settings.get('security.protocol', 'plaintext')}): {reason}") from None

    return names


def _topic_error(bootstrap: str, topic: str, client: str, config: dict[str, Any], timeout_s: float) -> int | None:
    """Kafka's error code for a metadata request naming ``topic`` (None: no error, or no answer: the caller
    then reports the topic as missing, as it would without this probe), asked as the job asks."""
    try:
        return _ask_topic_error(bootstrap, topic, client, config, timeout_s)
    except Exception as err:
        LOG.debug("metadata request for %s failed: %s", topic, err)
        return None


def _ask_topic_error(bootstrap: str, topic: str, client: str, config: dict[str, Any], timeout_s: float) -> int | None:
    if check_client(client) == CONFLUENT:
        from confluent_kafka.admin import AdminClient

        settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "client.id": CLIENT_ID,
                                    "logger": logging.getLogger("kafka.librdkafka"), "allow.auto.create.topics": False,
                                    "log_level": 0}
        settings.update({k: v for k, v in to_librdkafka(config).items() if k.startswith(_RD_ADMIN)})
        found = AdminClient(settings).list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
        return None if found is None or found.error is None else int(found.error.code())
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=CLIENT_ID,
                             **{k: v for k, v in config.items() if k in KafkaAdminClient.DEFAULT_CONFIG})
    try:
        (described,) = admin.describe_topics([topic])
        return int(described["error_code"]) or None
    finally:
        admin.close()


def _reason(err: Exception) -> str:
    inner = err.args[0] if err.args else err
    return inner.str() if hasattr(inner, "str") else str(inner)


def _within(call: Callable[[], T], seconds: float, timeout_message: str) -> T:
    """``call()`` on a daemon thread, given up after ``seconds``: kafka-python (3.0) can wait forever in its
    bootstrap (a TLS handshake with a broker that speaks plaintext), whatever its own timeouts say."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as err:  # re-raised on the caller's thread
            result["error"] = err

    worker = threading.Thread(target=run, name="esa-preflight", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise KafkaUnavailableError(timeout_message)
    if "error" in result:
        raise result["error"]
    return result["value"]


def require_topics(bootstrap: str, topics: Iterable[str], timeout_s: float = 15.0, *, client: str = DEFAULT_CLIENT,
                   kafka_config: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`MissingTopicsError` naming every topic of ``topics`` the broker lacks (with the closest
    existing name, and the existing topics) so that a typo does not create a new, empty topic. ``client`` and
    ``kafka_config``: the job's (see :func:`existing_topics`)."""
    wanted = [t for t in dict.fromkeys(topics) if t]
    if not wanted:
        return
    have = existing_topics(bootstrap, timeout_s, client=client, kafka_config=kafka_config)
    missing = [t for t in wanted if t not in have]
    if not missing:
        return
    # A broker with ACLs lists only the topics the principal may describe: ask for each missing one by name,
    # so "not allowed" is not reported as "does not exist" (Kafka answers a topic it hides with an
    # authorization error whether or not it exists).
    config = dict(kafka_config or {})
    denied = [t for t in missing
              if _topic_error(bootstrap, t, client, config, timeout_s) == _TOPIC_AUTHORIZATION_FAILED]
    if denied:
        who = config.get("sasl_plain_username") or config.get("sasl_username") or "this job's principal"
        raise TopicAuthorizationError(
            f"not authorized: {who} may not use topic(s) {', '.join(repr(t) for t in denied)} on {bootstrap} "
            "(TOPIC_AUTHORIZATION_FAILED): the broker's ACLs do not grant it; see docs/operations.md")
    hints = []
    for topic in missing:
        close = difflib.get_close_matches(topic, sorted(have), n=1, cutoff=0.6)
        hints.append(f"{topic!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    listing = ", ".join(sorted(have)) if have else "none"
    raise MissingTopicsError(f"topic(s) {', '.join(hints)} do not exist on {bootstrap}; existing topics: {listing}")
