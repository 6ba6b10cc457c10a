"""The unbounded Kafka SDF on Beam's FnApiRunner against a real broker, on both client libraries; and its
watermark estimator on its own."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from transforms.io.kafka.bounded import committed_offsets, ensure_topics, produce_records
from transforms.io.kafka.config import CLIENTS
from transforms.io.kafka.unbounded import PartitionWatermark, ReadFromKafkaUnbounded, SourceClock

N_FIRST, N_SECOND = 600, 150
STOP_IDLE_MS = 1500


class _AppendRecord(beam.DoFn):
    """Append (partition, offset, value) of every record to a file (the runner runs in this process, but a
    file also holds across SDK worker processes)."""

    def __init__(self, path: str):
        self._path = path

    def process(self, record) -> None:
        line = json.dumps([record.partition, record.offset, record.value.decode()]) + "\n"
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _read_all(broker, topic: str, group: str, client: str, out: Path, stop_idle_ms: int = STOP_IDLE_MS
              ) -> list[tuple[int, int, str]]:
    started = time.monotonic()
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        _ = (pipeline
             | ReadFromKafkaUnbounded(broker.bootstrap, topic, group, client=client, batched=False,
                                      clock=SourceClock(stop_after_idle_ms=stop_idle_ms))
             | beam.ParDo(_AppendRecord(str(out))))
    seconds = time.monotonic() - started
    assert seconds >= stop_idle_ms / 1000  # it waited for the idle time before it stopped
    if not out.exists():
        return []
    return [tuple(json.loads(line)) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("client", CLIENTS)
def test_every_record_once_then_only_newer_ones(broker, topic_name: str, tmp_path: Path, client: str) -> None:
    ensure_topics(broker.bootstrap, [topic_name], partitions=3, client=client)
    first = [f"a{i}".encode() for i in range(N_FIRST)]
    produce_records(broker.bootstrap, topic_name, first, client=client)
    group = f"{topic_name}-g"

    got = _read_all(broker, topic_name, group, client, tmp_path / "first.jsonl")
    assert sorted(v for _, _, v in got) == sorted(v.decode() for v in first)  # each exactly once
    assert len({(p, o) for p, o, _ in got}) == N_FIRST
    assert len({p for p, _, _ in got}) == 3  # spread over the three partitions, each read
    ends = {p: max(o for q, o, _ in got if q == p) + 1 for p in range(3)}
    assert committed_offsets(broker.bootstrap, group, topic_name, client=client) == ends  # on finalize

    second = [f"b{i}".encode() for i in range(N_SECOND)]
    produce_records(broker.bootstrap, topic_name, second, client=client)
    again = _read_all(broker, topic_name, group, client, tmp_path / "second.jsonl")
    assert sorted(v for _, _, v in again) == sorted(v.decode() for v in second)
    assert all(o >= ends[p] for p, o, _ in again)


@pytest.mark.parametrize("client", CLIENTS)
def test_idle_stop_waits_until_the_partition_end_is_read(broker, topic_name: str, tmp_path: Path,
                                                         client: str) -> None:
    """No idle time at all: every empty poll (the first fetches of a fresh consumer often are) would end the
    source with records still unread; it must go on to each partition's end offset first."""
    ensure_topics(broker.bootstrap, [topic_name], partitions=3, client=client)
    values = [f"c{i}".encode() for i in range(N_SECOND)]
    produce_records(broker.bootstrap, topic_name, values, client=client)
    got = _read_all(broker, topic_name, f"{topic_name}-g", client, tmp_path / "all.jsonl", stop_idle_ms=0)
    assert sorted(v for _, _, v in got) == sorted(v.decode() for v in values)


def test_empty_topic_stops_after_idle(broker, topic_name: str, tmp_path: Path) -> None:
    ensure_topics(broker.bootstrap, [topic_name], partitions=1)
    assert _read_all(broker, topic_name, f"{topic_name}-g", CLIENTS[0], tmp_path / "none.jsonl") == []
    assert committed_offsets(broker.bootstrap, f"{topic_name}-g", topic_name) == {}


def test_watermark_follows_max_event_time_then_wall_clock_when_idle() -> None:
    clock = SourceClock(out_of_orderness_ms=600_000, idle_timeout_ms=300_000)
    wm = PartitionWatermark((None, None, 6_000_000))
    assert wm.advance(6_000_000, clock) is None  # nothing seen, not idle yet
    wm.observe(5_000_000, 6_000_100)
    assert wm.advance(6_000_200, clock) == 5_000_000 - 600_000
    wm.observe(4_000_000, 6_000_300)  # an older event never moves it back
    assert wm.advance(6_000_400, clock) == 4_400_000
    # idle: 300 s after the last record, the wall clock (minus out-of-orderness) takes over if later
    assert wm.advance(6_000_300 + 299_999, clock) == 4_400_000
    later = 14_000_000
    assert wm.advance(later, clock) == later - 600_000
    assert wm.get_estimator_state() == (later - 600_000, 5_000_000, 6_000_300)
    restored = PartitionWatermark(wm.get_estimator_state())  # what a checkpointed residual resumes with
    assert restored.watermark_ms() == later - 600_000 and restored.idle_ms(later) == later - 6_000_300


def test_an_event_time_ahead_of_the_wall_clock_does_not_move_the_watermark_past_it() -> None:
    clock = SourceClock(out_of_orderness_ms=600_000, idle_timeout_ms=300_000)
    wm = PartitionWatermark((None, None, 6_000_000))
    wm.observe(6_000_000 + 3_600_000, 6_000_100)  # a device clock an hour fast
    assert wm.advance(6_000_200, clock) == 6_000_200 - 600_000


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="out_of_orderness"):
        SourceClock(out_of_orderness_ms=-1)
    with pytest.raises(ValueError, match="stop_after_idle"):
        SourceClock(stop_after_idle_ms=-5)
    with pytest.raises(ValueError, match="consumer group"):
        ReadFromKafkaUnbounded("127.0.0.1:1", "t", "")


def test_the_read_watermark_waits_for_every_partition() -> None:
    """One read for the whole topic: a partition that has shown nothing yet (and is not idle) holds the
    watermark, so windows cannot fire on the other partitions' times alone (the Flink cluster fault: an SDF
    element per partition held nothing until it started)."""
    from transforms.io.kafka.positions import TopicWatermark

    clock = SourceClock(out_of_orderness_ms=60_000, idle_timeout_ms=300_000)
    wm = TopicWatermark(((0, (None, None, 6_000_000)), (1, (None, None, 6_000_000)), (2, (None, None, 6_000_000))))
    wm.observe(0, 5_000_000, 6_000_100)
    wm.observe(1, 5_100_000, 6_000_100)
    assert wm.advance(6_000_200, clock) is None  # partition 2 has not been read: nothing moves
    wm.observe(2, 4_000_000, 6_000_300)
    assert wm.advance(6_000_400, clock) == 4_000_000 - 60_000  # the slowest partition sets it
    restored = TopicWatermark(wm.get_estimator_state())  # what a checkpointed residual resumes with
    assert restored.watermark_ms() == 4_000_000 - 60_000
    # a partition silent past the idle time-out follows the wall clock, as before; the others still hold it
    assert restored.advance(6_000_100 + 300_000, clock) == 4_000_000 - 60_000
    assert restored.advance(6_000_300 + 300_000, clock) == 6_000_300 + 300_000 - 60_000


def test_the_topic_tracker_claims_in_order_and_splits_only_at_a_checkpoint() -> None:
    from transforms.io.kafka.positions import TopicPositionsTracker, positions

    tracker = TopicPositionsTracker(positions({0: 10, 1: 0}))
    assert tracker.try_claim((0, 10)) and tracker.try_claim((1, 4)) and tracker.try_claim((0, 12))
    with pytest.raises(ValueError, match="claimed again"):
        tracker.try_claim((0, 11))
    assert tracker.try_split(0.5) is None  # no dynamic split: each partition is read in order by one reader
    primary, residual = tracker.try_split(0)
    assert residual == positions({0: 13, 1: 5}) and primary.done
    assert not tracker.try_claim((1, 5))  # the rest belongs to the residual
    tracker.check_done()
    finished = TopicPositionsTracker(positions({0: 3}))
    assert not finished.try_claim(None)  # claims nothing, finishes the read
    finished.check_done()
    assert finished.current_restriction() == positions({0: 3}, done=True)
