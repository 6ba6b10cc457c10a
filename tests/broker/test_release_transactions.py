"""The shuffler publishes each release in one Kafka transaction under its stream's transactional id.

Issue 26, finding 5 (and issue 21's transactional release publishing), on the real broker: a release whose
write fails half-way is invisible to the project's readers (read committed), and a second shuffler on the same
stream fences the first before it can publish again (a zombie cannot add a second release of a window).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.broker import LocalBroker
from transforms.io.kafka.bounded import ensure_topics, read_topic
from transforms.io.kafka.writer import KafkaTarget, TransactionalWriter, forget_writers
from transforms.shuffler import release_step
from transforms.shuffler.release_files import FRAME, iter_batches
from transforms.shuffler.release_step import ReleaseTarget, ShufflerFencedError, transactional_id
from transforms.state.layout import StateDir

pytestmark = pytest.mark.slow


def release_file(path: Path, batches: list[bytes], truncated: bool = False) -> Path:
    """A release file of ``batches``; ``truncated``: its last frame cut short (a damaged or failing read)."""
    data = b"".join(FRAME.pack(len(b)) + b for b in batches)
    path.write_bytes(data[:-3] if truncated else data)
    return path


def target_of(bootstrap: str, topic: str, tmp_path: Path) -> ReleaseTarget:
    """A shuffler's release target on ``topic`` (the paths are not written by ``publish``)."""
    return ReleaseTarget(StateDir(tmp_path / "state"), tmp_path / "keys", KafkaTarget.of(bootstrap, topic))


def publish(target: ReleaseTarget, tmp_path: Path, release_id: str, *batches: bytes) -> int:
    """``release_step.publish`` of a release file holding ``batches``."""
    return release_step.publish(target, release_id, release_file(tmp_path / release_id, list(batches)))


def in_log(bootstrap: str, topic: str) -> list[bytes]:
    """Every record in the log, uncommitted and aborted ones included (isolation.level=read_uncommitted)."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "esa-uncommitted-probe",
                       "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        return [m.value() for m in reader.consume(100, timeout=0.5) if m.error() is None]
    finally:
        reader.close()


def test_a_release_that_fails_half_way_is_invisible_to_readers(broker: LocalBroker, topic_name: str,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    target = target_of(broker.bootstrap, topic_name, tmp_path)
    broken = release_file(tmp_path / "broken", [b"batch-0", b"batch-1", b"batch-2"], truncated=True)

    def slow_batches(path: Path):  # the release file read: two batches, then (once both are in the log, as
        for i, batch in enumerate(iter_batches(path)):  # uncommitted records) the damaged frame
            yield batch
            if i == 1:
                deadline = time.monotonic() + 20
                while len(in_log(broker.bootstrap, topic_name)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)

    monkeypatch.setattr(release_step, "iter_batches", slow_batches)
    try:
        with pytest.raises(ValueError, match="ends inside a batch"):
            release_step.publish(target, "r1", broken)  # batches 0 and 1 were produced before the read failed
        assert in_log(broker.bootstrap, topic_name) == [b"batch-0", b"batch-1"]  # written, then aborted:
        assert read_topic(broker.bootstrap, topic_name) == []  # nothing of it is visible to the project's readers
        whole = release_file(tmp_path / "whole", [b"batch-0", b"batch-1", b"batch-2"])
        assert release_step.publish(target, "r1", whole) == 3
        assert [(r.key, r.value) for r in read_topic(broker.bootstrap, topic_name)] == [
            (b"r1:0", b"batch-0"), (b"r1:1", b"batch-1"), (b"r1:2", b"batch-2")]
    finally:
        forget_writers()


def test_a_second_shuffler_on_the_stream_fences_the_first(broker: LocalBroker, topic_name: str,
                                                          tmp_path: Path) -> None:
    ensure_topics(broker.bootstrap, [topic_name])
    first = target_of(broker.bootstrap, topic_name, tmp_path)
    try:
        assert publish(first, tmp_path, "w1", b"first's release of w1") == 1
        # another shuffler (other keys, other state) on the same stream: the same transactional id
        second = TransactionalWriter(first.stream, transactional_id(topic_name))
        with pytest.raises(ShufflerFencedError, match="fenced"):
            publish(first, tmp_path, "w2", b"the zombie's release of w2")
        with pytest.raises(ShufflerFencedError):  # and it stays fenced
            publish(first, tmp_path, "w2-again", b"again")
        assert second.write([(b"w2:0", b"second's release of w2")]) == 1
    finally:
        forget_writers()
    assert [r.value for r in read_topic(broker.bootstrap, topic_name)] == [b"first's release of w1",
                                                                            b"second's release of w2"]


def test_a_fenced_shuffler_exits_in_one_line_with_its_own_code(broker: LocalBroker, topic_name: str,
                                                               tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 34, L3': being fenced by a second shuffler is the documented outcome, not a bug: one line, exit 9
    (``pipelines.exit_codes.ExitCode.FENCED``), never a traceback or the generic Kafka exit 4."""
    from pipelines.cli import _error_code
    from pipelines.exit_codes import ExitCode

    ensure_topics(broker.bootstrap, [topic_name])
    first = target_of(broker.bootstrap, topic_name, tmp_path)
    try:
        publish(first, tmp_path, "w0", b"claims the stream")
        TransactionalWriter(first.stream, transactional_id(topic_name))  # the second shuffler claims it
        with pytest.raises(ShufflerFencedError) as fenced:
            publish(first, tmp_path, "w", b"zombie")
    finally:
        forget_writers()
    capsys.readouterr()
    assert _error_code("shuffle", fenced.value) == ExitCode.FENCED == 9
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fenced" in err and "Traceback" not in err
