"""Raw produce and consume rate of the two Kafka clients (kafka-python, confluent-kafka) on a local broker.

What the pipeline's Kafka IO costs at most, per client: ``produce_records`` (acks=all, the project's
producer settings) and a read of the planned ranges of a 3-partition topic with the project's consumer
(`transforms.io.kafka.bounded._read_range`: records materialized as ``KafkaRecord``s, as the jobs get them). The plan
(the end-of-log probe, ~0.6 s of idle polls whatever the size) is timed apart. Both clients read the same
topic, in alternating order; medians over --repeats.

    python benchmarks/kafka_clients.py --records 200000 --sizes 100 300 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from pipelines.broker import LocalBroker
from transforms.io.kafka.bounded import _read_range, ensure_topics, plan_bounded_read, produce_records
from transforms.io.kafka.clients import consumer
from transforms.io.kafka.config import CLIENTS

PARTITIONS = 3


def values(n: int, size: int) -> list[tuple[bytes, bytes]]:
    """Keyed records of ``size`` value bytes (incompressible, like sealed message sets)."""
    body = os.urandom(size)
    return [(b"client-%08d" % i, (b"%08d" % i) + body[8:]) for i in range(n)]


def produce_rate(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], client: str) -> float:
    ensure_topics(bootstrap, [topic], partitions=PARTITIONS, client=client)
    started = time.perf_counter()
    produce_records(bootstrap, topic, records, client=client)
    return len(records) / (time.perf_counter() - started)


def consume_rate(bootstrap: str, topic: str, client: str, expected: int) -> tuple[float, float]:
    """(records/s reading the planned ranges, seconds the plan took)."""
    started = time.perf_counter()
    plan = plan_bounded_read(bootstrap, topic, None, client=client)
    planned = time.perf_counter()
    reader = consumer(client, bootstrap)
    try:
        n = sum(len(batch) for r in plan for batch in _read_range(reader, r, 30.0))
    finally:
        reader.close()
    seconds = time.perf_counter() - planned
    if n != expected:
        raise RuntimeError(f"{client} read {n} records of {topic}, expected {expected}")
    return n / seconds, planned - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300], help="value bytes per record")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"{'client':<14}{'bytes':>6}{'produce/s':>12}{'consume/s':>12}{'plan s':>8}")
    with LocalBroker() as broker:
        for size in args.sizes:
            records = values(args.records, size)
            produced: dict[str, list[float]] = {c: [] for c in CLIENTS}
            consumed: dict[str, list[float]] = {c: [] for c in CLIENTS}
            planning: dict[str, list[float]] = {c: [] for c in CLIENTS}
            for r in range(args.repeats):
                order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
                topics = {c: f"bench-{c}-{size}-{r}" for c in CLIENTS}
                for client in order:
                    produced[client].append(produce_rate(broker.bootstrap, topics[client], records, client))
                shared = topics[order[0]]  # every client reads the same topic
                for client in order:
                    rate, plan_s = consume_rate(broker.bootstrap, shared, client, len(records))
                    consumed[client].append(rate)
                    planning[client].append(plan_s)
            for client in CLIENTS:
                print(f"{client:<14}{size:>6}{statistics.median(produced[client]):>12,.0f}"
                      f"{statistics.median(consumed[client]):>12,.0f}{statistics.median(planning[client]):>8.2f}")


if __name__ == "__main__":
    main()
