"""What configures an esa job: its options turned into a ``JobConfig`` once, and the summary a run returns.

Every job reads the same flags the same way (``config_from_options``), so a flag that cannot take effect
(``--streaming`` on a bounded job, an unknown ``--kafka_io``) is refused in one place with one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from pipelines.exit_codes import ConfigError, JobUsageError
from pipelines.options import (
    EsaKafkaOptions,
    EsaOptions,
    EsaServiceOptions,
    load_kafka_config,
    local_runner_requested,
)
from pipelines.paths import output_location
from pipelines.runners import prepare_runner
from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.io.staging import check_location, is_url
from transforms.spec import AnalysisSpec, load_spec
from transforms.state.files import StateLocked
from transforms.state.layout import StateDir
from transforms.trust.layout import KeysDir

LOG = logging.getLogger(__name__)

def local_output_dir(location: str) -> Path:
    """The job's output directory, created now: a one-line error (exit 3) if it cannot be, or if it is a URL.

    The analyzer writes each release's Parquet part with an atomic rename, which object stores such as
    gs:// do not offer; write to a local or mounted directory and publish with --estimates_topic.
    """
    where = output_location(location)
    if where.is_url:
        raise ConfigError(f"--output_dir {location}: the jobs write estimates with atomic renames, which URLs do "
                          "not support; give a local or mounted directory (and --estimates_topic to publish)")
    prepared = where.prepare().local
    assert prepared is not None
    return prepared


def default_state_dir(out_dir: Path) -> Path:
    """``OUT.state`` beside the output directory, never inside it: the analyst's outputs must not hold the
    other domains' state (raw dead letters, the device registry)."""
    return Path(out_dir).with_name(Path(out_dir).name + ".state")


def default_keys_dir(out_dir: Path) -> Path:
    """``OUT.keys`` beside the output directory (private keys never sit among the analyst's outputs)."""
    return Path(out_dir).with_name(Path(out_dir).name + ".keys")


class GroupInUse(StateLocked):
    """A fresh state directory pointed at a consumer group another job has already committed for."""


@dataclass(frozen=True)
class JobConfig:
    """Everything a job needs; built from the command-line options or directly in code."""
    bootstrap: str
    specs: tuple[AnalysisSpec, ...]
    out_dir: Path
    state_dir: Path | None = None  # default: OUT.state beside out_dir (default_state_dir)
    keys_dir: Path | None = None  # default: OUT.keys beside out_dir (default_keys_dir)
    raw_topic: str = "telemetry"
    reports_topic: str | None = "reports"
    shuffled_topic: str = "shuffled"
    devices_topic: str | None = "devices"  # enrolments (pipelines.registry); None: the legacy Parquet file only
    group_id: str = ""  # "": the stage's default (pipelines.broker.acls.DEFAULT_GROUPS, what the ACLs grant)
    dead_letter_topic: str | None = None
    estimates_topic: str | None = None
    seed: int | None = None
    kafka_io: str = "python"
    kafka_config: dict[str, Any] = field(default_factory=dict)
    kafka_client: str = DEFAULT_CLIENT  # "confluent" or "kafka-python" (transforms.io.kafka.clients)
    drain: bool = False
    out_of_orderness_seconds: int = 600
    idle_timeout_seconds: int = 300
    max_age_seconds: int = 30 * 86400
    max_skew_seconds: int = 3600
    now_ms: int | None = None  # the run's clock (tests and simulations may pin it)
    adopt_group: bool = False  # a fresh state dir may start from the group's committed offsets
    create_topics: bool = False  # create missing output topics (default: refuse them, a typo is never created)
    crypto_threads: int = 0  # per worker, for signatures and sealing (0: one per core); see transforms.runtime.parallel
    python_gc: str = "tuned"  # the workers' garbage collector: "tuned" or "default"; see transforms.runtime.worker_gc
    staging_location: str | None = None  # where workers stage a run's results; default: STATE/staging
    stop_after_idle_seconds: float | None = None  # --kafka_io sdf: end the stream after this long without data
    metrics_port: int = 0  # --kafka_io sdf: serve Prometheus metrics here while the stream runs (0: none)
    metrics_host: str = "127.0.0.1"

    @property
    def state(self) -> Path:
        return self.state_dir if self.state_dir is not None else default_state_dir(self.out_dir)

    @property
    def keys(self) -> Path:
        return self.keys_dir if self.keys_dir is not None else default_keys_dir(self.out_dir)

    @property
    def state_layout(self) -> StateDir:
        """The named sub-paths of this stage's state directory."""
        return StateDir(self.state)

    @property
    def keys_layout(self) -> KeysDir:
        """The named sub-paths of the keys directory."""
        return KeysDir(self.keys)

    def for_stage(self, stage: str) -> JobConfig:
        """Each stage keeps its state apart (its own trust domain): state_dir/<stage>, and its own group."""
        return replace(self, state_dir=self.state / stage).with_group(stage)

    def with_group(self, stage: str) -> JobConfig:
        """This config with ``stage``'s default consumer group unless one was given (``--consumer_group``)."""
        from pipelines.broker.acls import DEFAULT_GROUPS

        return self if self.group_id else replace(self, group_id=DEFAULT_GROUPS[stage])


@dataclass
class RunSummary:
    """Beam counters of one run and the record accounting of its stage."""
    counters: dict[str, int]
    out_dir: Path
    seconds: float
    stage: str
    parts: dict[str, int] = field(default_factory=dict)  # the accounting terms, named
    extra: dict[str, Any] = field(default_factory=dict)
    # Where this stage's dead letters went: its own state directory (``STATE/dead_letters``), never the output
    # directory, which several jobs started in one working directory would share (``./out`` by default).
    dead_letters_dir: Path | None = None
    # Records consumed, when not the runner's counter: the streaming shuffler after a runner restart counts them
    # from the committed offsets (``pipelines.stream_accounting``); None: ``kafka_records_read``.
    records_read: int | None = None

    def count(self, name: str) -> int:
        return int(self.counters.get(name, 0))

    @property
    def read(self) -> int:
        return self.count("kafka_records_read") if self.records_read is None else self.records_read

    @property
    def accounting(self) -> dict[str, int]:
        return {"read": self.read, **self.parts}

    @property
    def balanced(self) -> bool:
        """Every consumed record is used (or held for its window), deliberately deleted, or dead-lettered, once."""
        return self.read == sum(self.parts.values())

    def records_read_and_dead(self) -> tuple[int, int]:
        """(records read, records dead-lettered): what the dead-letter bar of the CLI is measured on."""
        dead = self.count("dead_lettered") if self.records_read is None else self.parts.get("dead_lettered", 0)
        return self.read, dead

    @property
    def estimates_path(self) -> Path:
        return self.out_dir / "estimates"

    @property
    def dead_letters_path(self) -> Path:
        return self.dead_letters_dir if self.dead_letters_dir is not None else self.out_dir / "dead_letters"


def config_from_options(options: PipelineOptions) -> JobConfig:
    """Turn command-line pipeline options into a config (specs are loaded and validated here)."""
    kafka, esa, service = (options.view_as(EsaKafkaOptions), options.view_as(EsaOptions),
                           options.view_as(EsaServiceOptions))
    if not esa.spec:
        raise JobUsageError("at least one --spec FILE.toml is required")
    check_kafka_io(options)
    prepare_runner(options)
    kafka_config = load_kafka_config(kafka.kafka_config, kafka.kafka_client)
    return JobConfig(
        bootstrap=kafka.kafka_bootstrap,
        specs=tuple(load_spec(p) for p in esa.spec),
        out_dir=local_output_dir(esa.output_dir),
        state_dir=Path(service.state_dir) if service.state_dir else None,
        keys_dir=Path(service.keys_dir) if service.keys_dir else None,
        raw_topic=kafka.raw_topic,
        reports_topic=kafka.reports_topic or None,
        shuffled_topic=kafka.shuffled_topic,
        devices_topic=kafka.devices_topic or None,
        group_id=kafka.consumer_group,
        dead_letter_topic=kafka.dead_letter_topic or None,
        create_topics=kafka.create_topics,
        estimates_topic=kafka.estimates_topic or None,
        seed=esa.seed,
        kafka_io=kafka.kafka_io,
        stop_after_idle_seconds=kafka.stop_after_idle_seconds,
        kafka_config=kafka_config,
        kafka_client=kafka.kafka_client,
        drain=service.drain,
        out_of_orderness_seconds=service.out_of_orderness_seconds,
        idle_timeout_seconds=service.idle_timeout_seconds,
        max_age_seconds=service.max_age_seconds,
        max_skew_seconds=service.max_skew_seconds,
        adopt_group=service.adopt_consumer_group,
        crypto_threads=service.crypto_threads,
        python_gc=service.python_gc,
        staging_location=staging_location_of(options),
        metrics_port=service.metrics_port if kafka.kafka_io == "sdf" else 0,
        metrics_host=service.metrics_host,
    )


def check_kafka_io(options: PipelineOptions) -> None:
    """``--kafka_io``: python (bounded runs), sdf (the streaming shuffler) or xlang (bounded runs read by Java's
    KafkaIO, on the Flink runner only: its Java harness runs in the job server's JVM, EMBEDDED)."""
    kafka, service = options.view_as(EsaKafkaOptions), options.view_as(EsaServiceOptions)
    if kafka.kafka_io == "xlang":
        runner = str(options.view_as(StandardOptions).runner or "")
        if not runner.endswith("FlinkRunner"):
            raise ConfigError(f"--kafka_io xlang runs Java's KafkaIO on the Flink runner only (not "
                              f"{runner or 'the local runner'}): add --runner FlinkRunner --flink_master HOST:PORT")
        if kafka.kafka_config:
            raise ConfigError("--kafka_io xlang does not pass --kafka_config to Java's consumer (its keys differ): "
                              "use the python reader on a secured cluster; see docs/deployment.md")
        if kafka.stop_after_idle_seconds is not None:
            raise ConfigError("--stop_after_idle_seconds applies to --kafka_io sdf only")
        return
    if kafka.stop_after_idle_seconds is not None and kafka.stop_after_idle_seconds < 0:
        raise ConfigError(f"--stop_after_idle_seconds must be >= 0, got {kafka.stop_after_idle_seconds}")
    if kafka.kafka_io != "sdf":
        if kafka.stop_after_idle_seconds is not None:
            raise ConfigError("--stop_after_idle_seconds applies to --kafka_io sdf only")
        return
    if service.follow:
        raise ConfigError("--kafka_io sdf is one continuous pipeline already: drop --follow")
    if local_runner_requested(options) and kafka.stop_after_idle_seconds is None:
        raise ConfigError("--kafka_io sdf on the local runner needs --stop_after_idle_seconds: it runs the source "
                          "to completion before any window is released (or run it on --runner PrismRunner, or "
                          "FlinkRunner/DataflowRunner with --streaming)")


def refuse_streaming(config: JobConfig, stage: str) -> None:
    """``--kafka_io sdf`` streams the shuffler only: the encoder and analyzer are bounded runs (``--follow``)."""
    if config.kafka_io == "sdf":
        raise ConfigError(f"--kafka_io sdf streams the shuffler only (esa shuffle, or esa run for the chain); "
                          f"esa {stage} runs bounded: drop --kafka_io sdf (and add --follow to keep it running)")


def staging_location_of(options: PipelineOptions) -> str | None:
    """``--staging_location`` (Beam's own flag, which Dataflow also stages its artifacts under), checked now.

    On Dataflow it is required: the workers cannot write the driver's local state directory.
    """
    location = options.view_as(GoogleCloudOptions).staging_location or None
    runner = str(options.view_as(StandardOptions).runner or "")
    if runner.endswith("DataflowRunner") and not (location and is_url(location)):
        raise ConfigError("DataflowRunner: the workers cannot write the driver's disk; give --staging_location "
                          "gs://BUCKET/PREFIX (see docs/deployment.md)")
    if location:
        try:
            check_location(location)
        except ValueError as err:
            raise ConfigError(f"--staging_location: {err}") from err
    return location
