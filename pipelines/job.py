"""What every esa job shares: its config, its Kafka sources and sinks, the run-and-commit step, and the
record accounting a user checks first.

A job reads bounded ranges of Kafka topics, runs on the FnApiRunner (or the runner the options name),
and commits the consumer group's offsets only after the pipeline finished successfully: a failed run is
re-read, and a second successful run reads nothing new.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines.options import EsaKafkaOptions, EsaOptions, local_runner_requested
from transforms.kafkaio import ReadFromKafkaBounded, read_from_kafka
from transforms.mechanisms.randomness import job_key_from_entropy, job_key_from_seed
from transforms.records import ReportElement
from transforms.sinks import WriteAvroFile, WriteEstimatesParquet, WriteRecordsToKafka
from transforms.spec import AnalysisSpec, load_spec

LOG = logging.getLogger(__name__)
ESTIMATES_FILE = "estimates.parquet"
DEAD_LETTERS_FILE = "dead_letters.avro"

# Per stage: the counters that must add up to the records read (plus the extra messages of multi-message
# encoders: an event that becomes k messages adds k - 1), and to the valid reports.
_BALANCE = {
    "end_to_end": (("dead_lettered", "reports_deleted", "reports_analyzed"), ("reports_deleted", "reports_analyzed")),
    "encode": (("dead_lettered", "events_encoded"), None),
    "shuffle": (("dead_lettered", "reports_deleted", "reports_released"), ("reports_deleted", "reports_released")),
    "analyze": (("dead_lettered", "reports_analyzed"), None),
}


@dataclass(frozen=True)
class JobConfig:
    """Everything a job needs; built from EsaOptions/EsaKafkaOptions or directly in code."""

    bootstrap: str
    specs: tuple[AnalysisSpec, ...]
    out_dir: Path
    raw_topic: str = "telemetry"
    reports_topic: str | None = "reports"
    shuffled_topic: str = "shuffled"
    group_id: str = "esa-end-to-end"
    dead_letter_topic: str | None = None
    estimates_topic: str | None = None
    seed: int | None = None
    kafka_io: str = "python"


@dataclass
class RunSummary:
    """Beam counters of one run and the record accounting of its stage."""

    counters: dict[str, int]
    out_dir: Path
    seconds: float
    stage: str = "end_to_end"

    def count(self, name: str) -> int:
        return int(self.counters.get(name, 0))

    @property
    def accounting(self) -> dict[str, int]:
        parts, valid = _BALANCE[self.stage]
        names = ["kafka_records_read", *parts, *(["reports_valid"] if valid else [])]
        short = {"kafka_records_read": "read", "reports_valid": "valid", "dead_lettered": "dead_lettered",
                 "reports_deleted": "deleted", "reports_analyzed": "analyzed", "events_encoded": "encoded",
                 "reports_released": "released"}
        out = {short[n]: self.count(n) for n in names}
        if self.stage == "end_to_end" and self.expanded:
            out["expanded"] = self.expanded
        return out

    @property
    def expanded(self) -> int:
        """Messages created beyond one per event by multi-message encoders (fragments, presence markers)."""
        return self.count("reports_encoded") - self.count("events_encoded")

    @property
    def balanced(self) -> bool:
        """Every consumed record is analyzed (or passed on), deliberately deleted, or dead-lettered, once."""
        parts, valid = _BALANCE[self.stage]
        extra = self.expanded if self.stage == "end_to_end" else 0
        ok = self.count("kafka_records_read") + extra == sum(self.count(p) for p in parts)
        return ok and (valid is None or self.count("reports_valid") == sum(self.count(p) for p in valid))

    @property
    def estimates_path(self) -> Path:
        return self.out_dir / ESTIMATES_FILE

    @property
    def dead_letters_path(self) -> Path:
        return self.out_dir / DEAD_LETTERS_FILE


def config_from_options(options: PipelineOptions) -> JobConfig:
    """Turn command-line pipeline options into a config (specs are loaded and validated here)."""
    kafka, esa = options.view_as(EsaKafkaOptions), options.view_as(EsaOptions)
    if not esa.spec:
        raise ValueError("at least one --spec FILE.toml is required")
    return JobConfig(
        bootstrap=kafka.kafka_bootstrap,
        specs=tuple(load_spec(p) for p in esa.spec),
        out_dir=Path(esa.output_dir),
        raw_topic=kafka.raw_topic,
        reports_topic=kafka.reports_topic or None,
        shuffled_topic=kafka.shuffled_topic,
        group_id=kafka.consumer_group,
        dead_letter_topic=kafka.dead_letter_topic or None,
        estimates_topic=kafka.estimates_topic or None,
        seed=esa.seed,
        kafka_io=kafka.kafka_io,
    )


class Sources:
    """Kafka sources of one pipeline; remembers the bounded readers whose offsets to commit."""

    def __init__(self, pipeline: beam.Pipeline, config: JobConfig):
        self.pipeline, self.config = pipeline, config
        self.readers: list[ReadFromKafkaBounded] = []

    @property
    def batched(self) -> bool:
        """The Python-native reader emits lists of records; the cross-language one single records."""
        return self.config.kafka_io == "python"

    def read(self, topic: str, label: str) -> beam.PCollection:
        config = self.config
        if self.batched:
            reader = ReadFromKafkaBounded(config.bootstrap, topic, config.group_id, batched=True)
            self.readers.append(reader)
            return self.pipeline | label >> reader
        return read_from_kafka(self.pipeline, bootstrap=config.bootstrap, topic=topic, group_id=config.group_id,
                               implementation=config.kafka_io, label=label)


def reports_of(batch: list[ReportElement], spec_id: str) -> Iterator[list[ReportElement]]:
    """The part of a batch of reports that belongs to one spec (batches stay batches)."""
    mine = [r for r in batch if r.spec_id == spec_id]
    if mine:
        yield mine


def encoder_key(config: JobConfig) -> bytes:
    """The secret key of the encoder's per-event PRF (OS entropy unless a test seed is given)."""
    return job_key_from_seed(config.seed) if config.seed is not None else job_key_from_entropy()


def write_dead_letters(config: JobConfig, dead: list[beam.PCollection]) -> None:
    """All dead letters of a job -> DIR/dead_letters.avro (and the dead-letter topic, if configured)."""
    all_dead = dead | "AllDeadLetters" >> beam.Flatten()
    config.out_dir.mkdir(parents=True, exist_ok=True)
    all_dead | "DeadLetterFile" >> WriteAvroFile(str(config.out_dir / DEAD_LETTERS_FILE), "DeadLetter")
    if config.dead_letter_topic:
        all_dead | "DeadLetterTopic" >> WriteRecordsToKafka(config.bootstrap, config.dead_letter_topic, "DeadLetter")


def write_estimates(config: JobConfig, estimates: list[beam.PCollection]) -> None:
    """Estimate records (global window) -> DIR/estimates.parquet (and the estimates topic, if configured)."""
    all_estimates = estimates | "AllEstimates" >> beam.Flatten()
    config.out_dir.mkdir(parents=True, exist_ok=True)
    all_estimates | "EstimatesFile" >> WriteEstimatesParquet(str(config.out_dir / ESTIMATES_FILE))
    if config.estimates_topic:
        all_estimates | "EstimatesTopic" >> WriteRecordsToKafka(config.bootstrap, config.estimates_topic, "Estimate")


def execute(config: JobConfig, build: Callable[[Sources], None], stage: str,
            options: PipelineOptions | None = None) -> RunSummary:
    """Build with ``build``, run, wait; commit offsets only if the run succeeded; return the summary."""
    options = options or PipelineOptions([])
    runner = FnApiRunner() if local_runner_requested(options) else None
    started = time.perf_counter()
    pipeline = beam.Pipeline(runner=runner, options=options)
    sources = Sources(pipeline, config)
    build(sources)
    LOG.info("running %s for %s", stage, ", ".join(s.spec_id for s in config.specs))
    result = pipeline.run()
    state = result.wait_until_finish()
    if str(state) not in {"DONE", "PipelineState.DONE"}:
        raise RuntimeError(f"pipeline ended in state {state}; offsets not committed")
    for reader in sources.readers:
        reader.commit_offsets()
    return RunSummary(counters=esa_counters(result), out_dir=config.out_dir,
                      seconds=time.perf_counter() - started, stage=stage)


def esa_counters(result: beam.runners.runner.PipelineResult) -> dict[str, int]:
    """Sum the ``esa`` namespace counters over steps (the same counter name is used by several stages)."""
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace("esa"))["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value)
    return totals
