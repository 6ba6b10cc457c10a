"""End-to-end throughput of the three jobs (encode, shuffle, analyze) on the FnApiRunner, with trust on.

For each mechanism and population size: the rate of each job in Kafka records per second (events for the
encoder, signed message sets for the shuffler, release batches -- and the messages in them -- for the
analyzer), the whole chain in events per second (every job on the Kafka client of --kafka_client), the raw
consume rate of BOTH clients (kafka-python: ``raw kp/s``, confluent-kafka: ``raw ck/s``) on the same raw
topic measured in the same run (the ceiling a job reading that topic could reach), the ratio of the chain
to the raw rate of the client it used, the peak
RSS of this process (the FnApiRunner runs in-process), and the error figures (max |z| and the share of
items within 3 stderr against the known truth). Medians over --repeats runs.

    python benchmarks/pipeline.py --clients 20000 --repeats 3 [--kafka_client kafka-python]
"""

from __future__ import annotations

import argparse
import logging
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.broker import LocalBroker
from pipelines.demo.population import synthesize, truth_table
from pipelines.demo.simulate import produce_population
from pipelines.end_to_end import run
from pipelines.enrolment import enrol_simulated
from pipelines.examples import example_path
from pipelines.job import JobConfig, default_keys_dir
from transforms.kafka_config import CLIENTS, CONFLUENT, DEFAULT_CLIENT, KAFKA_PYTHON
from transforms.kafkaio import read_topic
from transforms.spec import load_spec
from transforms.state.estimates_store import read_estimates


def raw_consume_rates(bootstrap: str, topic: str) -> dict[str, float]:
    """Records/s of reading ``topic`` whole (plan included) with each client, one after the other."""
    rates = {}
    for client in CLIENTS:
        t0 = time.perf_counter()
        rates[client] = len(read_topic(bootstrap, topic, client=client)) / (time.perf_counter() - t0)
    return rates


def one_run(bootstrap: str, spec, n: int, tag: str, base: Path, client: str) -> dict[str, float]:
    window_ms = spec.window_seconds * 1000
    start = (int(time.time() * 1000) // window_ms - 3) * window_ms
    population = synthesize(spec, n, start_ms=start, seed=hash(tag) % 2**31)
    out = base / tag
    enrol_simulated(default_keys_dir(out), population.client_ids.tolist())
    topics = {"raw_topic": f"raw-{tag}", "reports_topic": f"rep-{tag}"}
    produce_population(bootstrap, spec, population, client=client, **topics)
    raw = raw_consume_rates(bootstrap, topics["raw_topic"])
    config = JobConfig(bootstrap=bootstrap, specs=(spec,), out_dir=out, shuffled_topic=f"shuf-{tag}",
                       group_id=f"bench-{tag}", drain=True, kafka_client=client, **topics)
    summary = run(config)
    est = read_estimates(out).sort_by("item_index")
    truth = np.asarray(truth_table(spec, population)["frequency"])
    z = np.abs(np.asarray(est["raw_estimate"]) - truth * np.asarray(est["n_clients"]) / n) / np.asarray(est["stderr"])
    stages = summary.stages
    return {
        "encode": stages["encode"].count("kafka_records_read") / stages["encode"].seconds,
        "shuffle": stages["shuffle"].count("kafka_records_read") / stages["shuffle"].seconds,
        "analyze_msgs": stages["analyze"].count("messages_analyzed") / stages["analyze"].seconds,
        "chain": n / summary.seconds,
        "raw_kp": raw[KAFKA_PYTHON],
        "raw_ck": raw[CONFLUENT],
        "consume": raw[client],
        "max_z": float(z.max()),
        "within3": float(np.mean(z <= 3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mechanisms", nargs="+", default=["grr", "olh"])
    parser.add_argument("--kafka_client", default=DEFAULT_CLIENT, choices=list(CLIENTS),
                        help="the Kafka client every job uses (both are measured raw)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"{'mechanism':<10}{'n':>9}{'encode/s':>10}{'shuffle/s':>11}{'analyze msg/s':>15}{'chain ev/s':>12}"
          f"{'raw kp/s':>10}{'raw ck/s':>10}{'chain/raw':>10}{'max|z|':>8}{'in 3se':>8}   client {args.kafka_client}")
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        for mechanism in args.mechanisms:
            spec = load_spec(example_path("app_language.toml")).with_mechanism(mechanism, 2.0)
            for n in args.clients:
                runs = [one_run(broker.bootstrap, spec, n, f"{mechanism}-{n}-{r}", Path(tmp), args.kafka_client)
                        for r in range(args.repeats)]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                print(f"{mechanism:<10}{n:>9,}{med['encode']:>10,.0f}{med['shuffle']:>11,.0f}"
                      f"{med['analyze_msgs']:>15,.0f}{med['chain']:>12,.0f}{med['raw_kp']:>10,.0f}{med['raw_ck']:>10,.0f}"
                      f"{med['chain'] / med['consume']:>10.3f}{max(r['max_z'] for r in runs):>8.2f}"
                      f"{min(r['within3'] for r in runs):>8.1%}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
