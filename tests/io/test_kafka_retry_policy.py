"""The retry policy's decisions (`transforms.io.kafka.retry`) on librdkafka's and kafka-python's real error
objects, without a broker: which errors are waited out, how long, and what is said when it gives up."""

from __future__ import annotations

import logging

import kafka.errors as kp
import pytest
from confluent_kafka import KafkaError, KafkaException

from pipelines.cli import _error_code
from pipelines.exit_codes import ExitCode
from transforms.io.kafka import retry
from transforms.io.kafka.retry import KafkaCallError, RetryPolicy

FAST = RetryPolicy(deadline_s=5.0, first_wait_s=0.001, max_wait_s=0.004)
RETRIABLE = ("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART",
             "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR", "REQUEST_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT")


def _failing(errors: list[BaseException], result: str = "ok"):
    calls = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return fn, calls


@pytest.mark.parametrize("name", RETRIABLE)
def test_each_retriable_librdkafka_error_is_waited_out(name: str, caplog: pytest.LogCaptureFixture) -> None:
    err = KafkaException(KafkaError(getattr(KafkaError, name)))
    fn, calls = _failing([err, err])
    with caplog.at_level(logging.WARNING, logger=retry.__name__):
        assert retry.call("watermark offsets of t[0]", fn, FAST) == "ok"
    assert len(calls) == 3
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 2 and all("watermark offsets of t[0]" in w and "retrying in" in w for w in waits)


@pytest.mark.parametrize("name", RETRIABLE)
def test_without_the_retry_each_of_them_fails(name: str) -> None:
    fn, _ = _failing([KafkaException(KafkaError(getattr(KafkaError, name)))])
    with pytest.raises(KafkaCallError, match=name) as raised:
        retry.call("x", fn, RetryPolicy(attempts=1))
    assert raised.value.retriable


def test_kafka_python_errors_are_judged_the_same() -> None:
    fn, calls = _failing([kp.NotLeaderForPartitionError(), kp.KafkaTimeoutError()])
    assert retry.call("x", fn, FAST) == "ok" and len(calls) == 3
    fn, calls = _failing([kp.TopicAuthorizationFailedError()])
    with pytest.raises(KafkaCallError, match="refused"):
        retry.call("x", fn, FAST)
    assert len(calls) == 1


def test_a_non_retriable_error_is_not_retried() -> None:
    fn, calls = _failing([KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))])
    with pytest.raises(KafkaCallError, match=r"refused the commit.*TOPIC_AUTHORIZATION_FAILED") as raised:
        retry.call("commit", fn, FAST)
    assert len(calls) == 1 and not raised.value.retriable


def test_a_fatal_or_abortable_error_is_never_retried() -> None:
    fatal = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    abortable = KafkaError(KafkaError._TIMED_OUT, "abort", txn_requires_abort=True)
    for err in (fatal, abortable):
        fn, calls = _failing([KafkaException(err)])
        with pytest.raises(KafkaCallError):
            retry.call("commit", fn, FAST)
        assert len(calls) == 1


def test_the_deadline_bounds_the_waiting() -> None:
    err = KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
    fn, calls = _failing([err] * 10_000)
    with pytest.raises(KafkaCallError, match=r"still LEADER_NOT_AVAILABLE.* over 0\.\d s"):
        retry.call("metadata of t", fn, RetryPolicy(deadline_s=0.2, first_wait_s=0.01, max_wait_s=0.05))
    assert 3 <= len(calls) < 100  # doubling pauses, capped: a handful of attempts, not a busy loop


def test_errors_that_are_not_kafkas_pass_through_unchanged() -> None:
    fn, calls = _failing([KeyError("bug")])
    with pytest.raises(KeyError):
        retry.call("x", fn, FAST)
    assert len(calls) == 1


def test_the_esa_command_reports_a_kafka_call_error_in_one_line_with_exit_4(capsys: pytest.CaptureFixture) -> None:
    err = KafkaCallError("Kafka watermark offsets of t[0]: still NOT_LEADER_FOR_PARTITION after 9 attempt(s)")
    assert _error_code("encode", err) == ExitCode.KAFKA_UNREACHABLE == 4
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_the_producer_deadline_follows_the_policy() -> None:
    previous = retry.set_policy(RetryPolicy(deadline_s=7.0))
    try:
        assert retry.producer_timeout_ms() == 7000
    finally:
        retry.set_policy(previous)
