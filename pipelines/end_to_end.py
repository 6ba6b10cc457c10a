"""The whole chain in one Beam pipeline: raw topic (and device reports) -> estimates.

    Kafka raw topic ─ decode ▸ encode ─┐
                                       ├─▶ shuffle (per spec) ─▶ analyze ─▶ estimates.parquet [+ topic]
    Kafka reports topic ─ decode ──────┘
    every unusable record ─────────────────────────────────────────────▶ dead_letters.avro [+ topic]

Offsets are committed only after the pipeline finished successfully, so a failed run is re-read and a
second successful run reads nothing new. The run returns a summary of the record accounting:
read = dead-lettered + deleted (crowd threshold) + analyzed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import window

from pipelines.options import EsaKafkaOptions, EsaOptions, local_runner_requested
from transforms.analyze import Analyze
from transforms.encode import DecodeReports, EncodeEvents
from transforms.kafkaio import ReadFromKafkaBounded, read_from_kafka
from transforms.mechanisms.randomness import job_key_from_entropy, job_key_from_seed
from transforms.records import ReportElement
from transforms.shuffle import Shuffle
from transforms.sinks import WriteAvroFile, WriteEstimatesParquet, WriteRecordsToKafka
from transforms.spec import AnalysisSpec, load_spec

LOG = logging.getLogger(__name__)
ESTIMATES_FILE = "estimates.parquet"
DEAD_LETTERS_FILE = "dead_letters.avro"


@dataclass(frozen=True)
class EndToEndConfig:
    """Everything one end-to-end run needs; built from EsaOptions/EsaKafkaOptions or directly in code."""

    bootstrap: str
    specs: tuple[AnalysisSpec, ...]
    out_dir: Path
    raw_topic: str = "telemetry"
    reports_topic: str | None = "reports"
    group_id: str = "esa-end-to-end"
    dead_letter_topic: str | None = None
    estimates_topic: str | None = None
    seed: int | None = None
    kafka_io: str = "python"


@dataclass
class RunSummary:
    """Beam counters of one run and the record accounting a user checks first."""

    counters: dict[str, int]
    out_dir: Path
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)

    def count(self, name: str) -> int:
        return int(self.counters.get(name, 0))

    @property
    def accounting(self) -> dict[str, int]:
        return {
            "read": self.count("kafka_records_read"),
            "valid": self.count("reports_valid"),
            "dead_lettered": self.count("dead_lettered"),
            "deleted": self.count("reports_deleted"),
            "analyzed": self.count("reports_analyzed"),
        }

    @property
    def balanced(self) -> bool:
        """Every consumed record is analyzed, deliberately deleted, or dead-lettered, exactly once."""
        a = self.accounting
        return a["read"] == a["dead_lettered"] + a["deleted"] + a["analyzed"] and \
            a["valid"] == a["deleted"] + a["analyzed"]

    @property
    def estimates_path(self) -> Path:
        return self.out_dir / ESTIMATES_FILE

    @property
    def dead_letters_path(self) -> Path:
        return self.out_dir / DEAD_LETTERS_FILE


def config_from_options(options: PipelineOptions) -> EndToEndConfig:
    """Turn command-line pipeline options into a config (specs are loaded and validated here)."""
    kafka, esa = options.view_as(EsaKafkaOptions), options.view_as(EsaOptions)
    if not esa.spec:
        raise ValueError("at least one --spec FILE.toml is required")
    return EndToEndConfig(
        bootstrap=kafka.kafka_bootstrap,
        specs=tuple(load_spec(p) for p in esa.spec),
        out_dir=Path(esa.output_dir),
        raw_topic=kafka.raw_topic,
        reports_topic=kafka.reports_topic or None,
        group_id=kafka.consumer_group,
        dead_letter_topic=kafka.dead_letter_topic or None,
        estimates_topic=kafka.estimates_topic or None,
        seed=esa.seed,
        kafka_io=kafka.kafka_io,
    )


def build(pipeline: beam.Pipeline, config: EndToEndConfig) -> list[ReadFromKafkaBounded]:
    """Add the end-to-end graph to ``pipeline``; returns the bounded readers whose offsets to commit."""
    readers: list[ReadFromKafkaBounded] = []

    def source(topic: str, label: str) -> beam.PCollection:
        if config.kafka_io == "python":
            reader = ReadFromKafkaBounded(config.bootstrap, topic, config.group_id, batched=True)
            readers.append(reader)
            return pipeline | label >> reader
        return read_from_kafka(pipeline, bootstrap=config.bootstrap, topic=topic, group_id=config.group_id,
                               implementation=config.kafka_io)

    job_key = job_key_from_seed(config.seed) if config.seed is not None else job_key_from_entropy()
    specs = list(config.specs)
    raw = source(config.raw_topic, "ReadRaw")
    reports, dead_encode = raw | "Encode" >> EncodeEvents(specs, job_key, batched_input=config.kafka_io == "python")
    dead = [dead_encode]
    if config.reports_topic:
        device_reports, dead_reports = source(config.reports_topic, "ReadReports") | "DecodeDevice" >> \
            DecodeReports(specs)
        reports = (reports, device_reports) | "AllReports" >> beam.Flatten()
        dead.append(dead_reports)
    estimates = []
    for i, spec in enumerate(specs):
        mine = reports | f"Select{i}" >> beam.FlatMap(_reports_of, spec.spec_id)
        shuffled, dead_shuffle = mine | f"Shuffle{i}" >> Shuffle(spec, seed=config.seed)
        dead.append(dead_shuffle)
        estimates.append(shuffled | f"Analyze{i}" >> Analyze(spec)
                         | f"EstimatesGlobal{i}" >> beam.WindowInto(window.GlobalWindows()))
    all_estimates = estimates | "AllEstimates" >> beam.Flatten()
    all_dead = dead | "AllDeadLetters" >> beam.Flatten()
    config.out_dir.mkdir(parents=True, exist_ok=True)
    all_estimates | "EstimatesFile" >> WriteEstimatesParquet(str(config.out_dir / ESTIMATES_FILE))
    all_dead | "DeadLetterFile" >> WriteAvroFile(str(config.out_dir / DEAD_LETTERS_FILE), "DeadLetter")
    if config.estimates_topic:
        all_estimates | "EstimatesTopic" >> WriteRecordsToKafka(config.bootstrap, config.estimates_topic, "Estimate")
    if config.dead_letter_topic:
        all_dead | "DeadLetterTopic" >> WriteRecordsToKafka(config.bootstrap, config.dead_letter_topic,
                                                            "DeadLetter")
    return readers


def _reports_of(batch: list[ReportElement], spec_id: str) -> Iterator[list[ReportElement]]:
    """The part of a batch of reports that belongs to one spec (batches stay batches)."""
    mine = [r for r in batch if r.spec_id == spec_id]
    if mine:
        yield mine


def run(config: EndToEndConfig, options: PipelineOptions | None = None) -> RunSummary:
    """Build, run and wait; commit Kafka offsets only if the run succeeded; return the summary."""
    options = options or PipelineOptions([])
    runner = FnApiRunner() if local_runner_requested(options) else None
    started = time.perf_counter()
    pipeline = beam.Pipeline(runner=runner, options=options)
    readers = build(pipeline, config)
    LOG.info("running end-to-end pipeline for %s", ", ".join(s.spec_id for s in config.specs))
    result = pipeline.run()
    state = result.wait_until_finish()
    if str(state) not in {"DONE", "PipelineState.DONE"}:
        raise RuntimeError(f"pipeline ended in state {state}; offsets not committed")
    for reader in readers:
        reader.commit_offsets()
    return RunSummary(counters=esa_counters(result), out_dir=config.out_dir,
                      seconds=time.perf_counter() - started)


def esa_counters(result: beam.runners.runner.PipelineResult) -> dict[str, int]:
    """Sum the ``esa`` namespace counters over steps (the same counter name is used by several stages)."""
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace("esa"))["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value)
    return totals


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa run --spec X.toml --kafka_bootstrap HOST:PORT ...`` (Beam flags pass through)."""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
