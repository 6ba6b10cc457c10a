"""The one retry policy of every Kafka call the jobs make: what is retried, how long, and what is said.

Why: right after a broker restart, a leader election or a topic's creation, Kafka answers
NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION, COORDINATOR_LOAD_IN_PROGRESS,
NOT_COORDINATOR or a request time-out for a moment. Kafka marks these *retriable* (its Java clients wait them
out up to ``default.api.timeout.ms``), but librdkafka's synchronous calls (watermark offsets, offsets for
times, committed offsets, commit, transactions) return them at once, and a job that raised there turned a
routine Kafka event into a failed run. Every such call goes through `call`: a retriable error is waited out
with a doubling pause (``first_wait_s`` .. ``max_wait_s``) until ``deadline_s`` has passed, one log line per
wait; a non-retriable error, or a retriable one that outlives the deadline, raises `KafkaCallError` (the
``esa`` command prints it in one line, exit 4). Produced records are retried by the client libraries
themselves (idempotent producers), bounded by the same deadline (`producer_timeout_ms`).

`POLICY` is read at each call, so a test can set ``RetryPolicy(attempts=1)`` (no retry) to show a forced
error is really there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["POLICY", "KafkaCallError", "RetryPolicy", "call", "is_retriable", "producer_timeout_ms", "set_policy"]

LOG = logging.getLogger(__name__)
T = TypeVar("T")

# librdkafka error names treated as retriable even where KafkaError.retriable() says no: each clears by itself
# once a leader is elected, a coordinator loaded, a topic's metadata propagated or a broker back.
_RD_RETRIABLE = frozenset({
    "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART", "COORDINATOR_LOAD_IN_PROGRESS",
    "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT",
    "_ALL_BROKERS_DOWN", "_WAIT_COORD", "_LEADER_NOT_AVAILABLE", "_UNKNOWN_PARTITION", "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NETWORK_EXCEPTION", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR", "CONCURRENT_TRANSACTIONS", "_OUTDATED",
    "REBALANCE_IN_PROGRESS", "_IN_PROGRESS",
    # a request in flight to a broker that left the metadata (fenced, restarted with a new handle) is aborted
    # with this local error; asked again, it goes to the partition's next leader
    "_DESTROY_BROKER",
})


class KafkaCallError(RuntimeError):
    """A Kafka call failed for good: a non-retriable error, or a retriable one past the deadline (exit 4).

    ``cause`` is the client library's error, ``retriable`` whether waiting longer might have helped."""

    def __init__(self, message: str, cause: BaseException | None = None, retriable: bool = False) -> None:
        super().__init__(message)
        self.cause, self.retriable = cause, retriable


@dataclass(frozen=True)
class RetryPolicy:
    """How long a retriable Kafka error is waited out. ``attempts=None``: until ``deadline_s``."""

    deadline_s: float = 120.0
    first_wait_s: float = 0.1
    max_wait_s: float = 5.0
    attempts: int | None = None

    def __post_init__(self) -> None:
        if self.deadline_s < 0 or self.first_wait_s <= 0 or self.max_wait_s < self.first_wait_s:
            raise ValueError("need deadline_s >= 0 and 0 < first_wait_s <= max_wait_s")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 or None, got {self.attempts}")


POLICY = RetryPolicy()


def set_policy(policy: RetryPolicy) -> RetryPolicy:
    """Make ``policy`` the one every later call uses; returns the previous one."""
    global POLICY
    previous, POLICY = POLICY, policy
    return previous


def kafka_error_of(err: BaseException | None) -> Any:
    """The client library's error object behind ``err`` (librdkafka's KafkaError, or a kafka-python error)."""
    seen = 0
    while err is not None and seen < 8:
        inner = err.args[0] if err.args else None
        if hasattr(inner, "retriable") and hasattr(inner, "code"):  # confluent_kafka.KafkaError
            return inner
        if type(err).__module__.startswith("kafka.") and hasattr(err, "retriable"):  # kafka.errors.*
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def is_retriable(err: BaseException) -> bool:
    """Whether Kafka says waiting may clear ``err`` (never for a fatal or abort-requiring transaction error)."""
    found = kafka_error_of(err)
    if found is None:
        return False
    if callable(getattr(found, "fatal", None)):  # librdkafka
        if found.fatal() or found.txn_requires_abort():
            return False
        return bool(found.retriable()) or found.name() in _RD_RETRIABLE
    if type(found).__name__ in ("KafkaTimeoutError", "NoBrokersAvailable", "KafkaConnectionError"):
        return True  # kafka-python marks its own time-outs and lost connections not retriable; they clear
    return bool(getattr(found, "retriable", False))


def describe(err: BaseException) -> str:
    """One line: the error's Kafka name and text."""
    found = kafka_error_of(err)
    if found is not None and callable(getattr(found, "name", None)):
        return f"{found.name()}: {found.str()}"
    return " ".join(f"{type(err).__name__}: {err}".split())


def call(what: str, fn: Callable[[], T], policy: RetryPolicy | None = None,
         retriable: Callable[[BaseException], bool] = is_retriable) -> T:
    """``fn()``; a retriable error is waited out under ``policy`` (default `POLICY`). ``what`` names the call
    in the log and in the error ("watermark offsets of reports[2]")."""
    rules = policy if policy is not None else POLICY
    start = time.monotonic()
    deadline, pause, attempt = start + rules.deadline_s, rules.first_wait_s, 0
    while True:
        attempt += 1
        try:
            return fn()
        except KafkaCallError:
            raise
        except Exception as err:
            if kafka_error_of(err) is None and not retriable(err):
                raise  # not Kafka's: a bug or a caller's error, as it was
            waited = time.monotonic() - start
            if not retriable(err):
                raise KafkaCallError(f"Kafka refused the {what}: {describe(err)}", err) from None
            out_of_attempts = rules.attempts is not None and attempt >= rules.attempts
            if out_of_attempts or time.monotonic() + pause > deadline:
                raise KafkaCallError(f"Kafka {what}: still {describe(err)} after {attempt} attempt(s) over "
                                     f"{waited:.1f} s (a retriable error that did not clear; is the broker up and "
                                     f"the partition led?)", err, retriable=True) from None
            LOG.warning("Kafka %s: %s; retrying in %.1f s (attempt %d, %.0f s left)", what, describe(err), pause,
                        attempt, deadline - time.monotonic())
            time.sleep(pause)
            pause = min(rules.max_wait_s, pause * 2)


def producer_timeout_ms(policy: RetryPolicy | None = None) -> int:
    """How long a client library may retry a produced record (librdkafka ``message.timeout.ms``, kafka-python
    ``delivery_timeout_ms``): the same deadline as every other call."""
    rules = policy if policy is not None else POLICY
    return max(1_000, int(rules.deadline_s * 1000))
