"""The unbounded SDF source and the streaming shuffler against their bounded counterparts, on the same input.

Prints (asserts nothing):

* **source**: records/s of ``ReadFromKafkaUnbounded`` (the SDF, claiming and committing on finalize) and of
  ``ReadFromKafkaBounded`` reading the same topic on the FnApiRunner, records counted by a trivial DoFn. The
  SDF's wall time includes its idle stop (``--idle`` seconds without data), which is subtracted;
* **shuffle**: records/s of ``esa shuffle --drain`` (bounded) and ``esa shuffle --kafka_io sdf`` on the same
  reports topic (each with its own state and consumer group), over the job's whole run (Beam start-up
  included; the sdf run minus its idle stop), and whether both released the same digests.

    python benchmarks/sdf_source.py --clients 20000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

EXAMPLE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "app_language.toml"


class _Count(beam.DoFn):
    def __init__(self) -> None:
        from apache_beam.metrics import Metrics

        self._n = Metrics.counter("bench", "records")

    def process(self, element: object) -> None:
        self._n.inc(len(element) if isinstance(element, list) else 1)


def _count(result: object) -> int:
    from apache_beam.metrics.metric import MetricsFilter

    found = result.metrics().query(MetricsFilter().with_namespace("bench"))["counters"]  # type: ignore[attr-defined]
    return int(sum(c.committed for c in found))


def read_rates(bootstrap: str, topic: str, idle_s: float, client: str) -> dict[str, tuple[int, float]]:
    from transforms.io.kafka.bounded import ReadFromKafkaBounded
    from transforms.io.kafka.unbounded import ReadFromKafkaUnbounded, SourceClock

    out = {}
    readers = {
        "bounded": lambda: ReadFromKafkaBounded(bootstrap, topic, f"bench-b-{time.time_ns()}", batched=True,
                                                client=client),
        "sdf": lambda: ReadFromKafkaUnbounded(bootstrap, topic, f"bench-s-{time.time_ns()}", client=client,
                                              clock=SourceClock(stop_after_idle_ms=int(idle_s * 1000))),
    }
    for name, make in readers.items():
        started = time.perf_counter()
        pipeline = beam.Pipeline(runner=FnApiRunner())
        _ = pipeline | make() | beam.ParDo(_Count())
        result = pipeline.run()
        result.wait_until_finish()
        seconds = time.perf_counter() - started - (idle_s if name == "sdf" else 0.0)
        out[name] = (_count(result), seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20_000)
    parser.add_argument("--idle", type=float, default=2.0, help="the sdf runs' idle stop, seconds")
    parser.add_argument("--client", default="confluent", choices=["confluent", "kafka-python"])
    args = parser.parse_args()

    from pipelines import encode, shuffle
    from pipelines.broker import LocalBroker
    from pipelines.demo.population import synthesize
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated
    from pipelines.job_config import JobConfig
    from transforms.io.kafka.bounded import ensure_topics
    from transforms.spec import load_spec
    from transforms.state.ledger import ReleaseLedger

    spec = load_spec(EXAMPLE_SPEC)
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        topics = {"raw_topic": "bench-raw", "reports_topic": "bench-rep", "shuffled_topic": "bench-shuf"}
        ensure_topics(broker.bootstrap, [*topics.values(), "bench-shuf-sdf"], partitions=3)
        window_ms = spec.window_seconds * 1000
        population = synthesize(spec, args.clients, windows=2, seed=5,
                                start_ms=(int(time.time() * 1000) // window_ms - 4) * window_ms)
        enrol_simulated(base / "keys", population.client_ids.tolist())
        produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                           reports_topic=topics["reports_topic"])
        config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=base / "out", keys_dir=base / "keys",
                           group_id="bench", seed=5, drain=True, kafka_client=args.client, **topics)
        encode.run(config.for_stage("encode"))

        for name, (n, seconds) in read_rates(broker.bootstrap, topics["reports_topic"], args.idle,
                                             args.client).items():
            print(f"source {name:8s} {n:8,} records in {seconds:6.2f} s: {n / seconds:10,.0f} records/s")

        bounded_cfg = replace(config, group_id="bench-bounded").for_stage("shuffle-bounded")
        started = time.perf_counter()
        bounded = shuffle.run(bounded_cfg)
        bounded_s = time.perf_counter() - started
        sdf_cfg = replace(config, group_id="bench-sdf", kafka_io="sdf", stop_after_idle_seconds=args.idle,
                          shuffled_topic="bench-shuf-sdf").for_stage("shuffle-sdf")
        started = time.perf_counter()
        sdf = shuffle.run(sdf_cfg)
        sdf_s = time.perf_counter() - started - args.idle
        for name, summary, seconds in (("bounded", bounded, bounded_s), ("sdf", sdf, sdf_s)):
            read = summary.count("kafka_records_read")
            print(f"shuffle {name:8s} {read:8,} records in {seconds:6.2f} s: {read / seconds:10,.0f} records/s, "
                  f"balanced {summary.balanced}")
        digests = [sorted(e.digest for e in ReleaseLedger(c.state / "ledger").entries())
                   for c in (bounded_cfg, sdf_cfg)]
        print(f"identical releases: {digests[0] == digests[1]} ({len(digests[0])} windows)")


if __name__ == "__main__":
    main()
