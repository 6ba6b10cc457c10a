"""Produce and consume throughput of the local broker: memory vs durable (fsync on and off).

For each storage mode, starts a `LocalBroker`, then --repeats times: produces --records records of
--size bytes to a fresh 3-partition topic with the project's producer settings (acks=all, linger 20 ms,
512 KiB batches; `transforms.kafkaio.produce_records`), and reads them all back with one consumer from the
beginning. Also --sync records sent one at a time, each awaited (acks=all): the per-request latency that a
durable write adds (several object-store round trips and fsyncs per produce request). Prints the median
records/s of each, and for durable modes the bytes on disk per record.

Reading the figures: the Python producer and consumer bound the memory broker. On the durable broker, tansu
stores one object per produced batch and its fetch returns about one batch per partition per request, so the
consume rate follows the producer's batch sizes: a store that acknowledges faster (no fsync) lets the
producer send smaller batches (162 instead of 39 objects for 50,000 records here) and reading them back
is slower.

    python benchmarks/broker.py                    # 50,000 records of 100 bytes, median of 3
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipelines.broker import LocalBroker
from transforms.kafkaio import ensure_topics, produce_records

PARTITIONS = 3


def _consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 120.0) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                             max_partition_fetch_bytes=16 * 1024 * 1024)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        seen, deadline = 0, time.monotonic() + timeout_s
        while seen < expected and time.monotonic() < deadline:
            seen += sum(len(batch) for batch in consumer.poll(timeout_ms=500, max_records=10_000).values())
        return seen
    finally:
        consumer.close(autocommit=False)


def _produce_one_by_one(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % PARTITIONS).get(timeout=30)
    finally:
        producer.close(timeout=5)


def _disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*.obj"))


def bench(mode: str, records: int, size: int, repeats: int, sync: int) -> tuple[float, float, float, float | None]:
    """Median produce, consume and one-by-one produce records/s, and bytes on disk per record (durable)."""
    values = [os.urandom(size) for _ in range(records)]
    with tempfile.TemporaryDirectory() as tmp:
        durable = Path(tmp) if mode != "memory" else None
        produce, consume, one_by_one = [], [], []
        with LocalBroker(durable_dir=durable, fsync=mode != "durable-nofsync") as broker:
            for r in range(repeats):
                topic = f"bench-{r}"
                ensure_topics(broker.bootstrap, [topic], partitions=PARTITIONS)
                t0 = time.perf_counter()
                produce_records(broker.bootstrap, topic, values)
                produce.append(records / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                seen = _consume_all(broker.bootstrap, topic, records)
                consume.append(records / (time.perf_counter() - t0))
                if seen != records:
                    raise RuntimeError(f"{mode}: read {seen} of {records} records back")
            per_record = _disk_bytes(Path(tmp) / "store" / "objects") / (records * repeats) if durable else None
            for r in range(repeats):
                topic = f"sync-{r}"
                ensure_topics(broker.bootstrap, [topic], partitions=PARTITIONS)
                t0 = time.perf_counter()
                _produce_one_by_one(broker.bootstrap, topic, values[:sync])
                one_by_one.append(sync / (time.perf_counter() - t0))
    return statistics.median(produce), statistics.median(consume), statistics.median(one_by_one), per_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync", type=int, default=500, help="records produced one at a time")
    parser.add_argument("--modes", nargs="+", default=["memory", "durable", "durable-nofsync"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    print(f"{args.records:,} records of {args.size} bytes, {PARTITIONS} partitions, median of {args.repeats}")
    print(f"{'mode':<18}{'produce rec/s':>15}{'consume rec/s':>15}{'1-by-1 rec/s':>14}{'disk B/rec':>12}")
    for mode in args.modes:
        produce, consume, one_by_one, per_record = bench(mode, args.records, args.size, args.repeats, args.sync)
        disk = f"{per_record:>12.1f}" if per_record is not None else f"{'-':>12}"
        print(f"{mode:<18}{produce:>15,.0f}{consume:>15,.0f}{one_by_one:>14,.0f}{disk}", flush=True)


if __name__ == "__main__":
    main()
