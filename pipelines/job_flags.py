"""The esa jobs' own flags, declared once and without Beam, each with the jobs it applies to.

``pipelines.options`` registers them with Beam (its ``PipelineOptions`` classes add these flags), and
``esa JOB --help`` lists the flags of that job from here: importing Beam takes seconds (10 s and more on a
loaded machine), which a ``--help`` or a bad spec should not cost. A flag a job does not use (``--drain`` to
the encoder) is still accepted by every job, as Beam accepts it; it is only left out of that job's help.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transforms.io.kafka.config import CLIENTS, DEFAULT_CLIENT

JOBS = ("run", "encode", "shuffle", "analyze")
ALL = frozenset(JOBS)
# The jobs whose pipeline holds windows open (the shuffler, alone or as the middle step of ``esa run``).
WINDOWED = frozenset({"run", "shuffle"})
RUNNERS_HELP = ("Beam runner: FnApiRunner (the default, in-process), DirectRunner, PrismRunner, FlinkRunner, "
                "DataflowRunner or PortableRunner (or a dotted class path); a misspelt name is refused")


@dataclass(frozen=True)
class Flag:
    """One ``add_argument`` call, and the jobs that use the flag."""

    name: str
    jobs: frozenset[str]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def _flag(name: str, jobs: frozenset[str] = ALL, **kwargs: Any) -> Flag:
    return Flag(name, jobs, kwargs)


KAFKA = (
    _flag("--kafka_bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers (host:port[,host:port])"),
    _flag("--raw_topic", frozenset({"run", "encode"}), default="telemetry", help="topic of TelemetryEvent records"),
    _flag("--reports_topic", frozenset({"run", "encode", "shuffle"}), default="reports",
          help="topic of signed message sets: written by devices (or `esa encode`), read by `esa shuffle`"),
    _flag("--shuffled_topic", frozenset({"run", "shuffle", "analyze"}), default="shuffled",
          help="topic of signed release batches between the shuffle and analyze jobs"),
    _flag("--devices_topic", frozenset({"run", "shuffle"}), default="devices",
          help="compacted topic of device enrolments (keyed by device id), read by `esa shuffle` into its device "
               "store at the start of each run ('' = only the legacy KEYS/registry/devices.parquet); see "
               "docs/operations.md"),
    _flag("--consumer_group", default="",
          help="consumer group the job commits its read offsets to (default: the job's own, esa-encode, "
               "esa-shuffle or esa-analyze, the groups the documented ACLs grant)"),
    _flag("--dead_letter_topic", default="",
          help="also publish dead letters to PREFIX-encode, PREFIX-shuffle or PREFIX-analyze, the topic of the "
               "job's own trust domain ('' = off; the analyzer's hold no raw bytes); see docs/operations.md"),
    _flag("--create_topics", action="store_true",
          help="create the topics this job writes if they are missing (default: refuse to start and name them, so "
               "a typo is never created and published to)"),
    _flag("--estimates_topic", frozenset({"run", "analyze"}), default="",
          help="also publish estimates here ('' = off)"),
    _flag("--kafka_config", default="", metavar="FILE",
          help="file of extra Kafka client settings, one key=value per line (TLS/SASL: security_protocol, "
               "ssl_cafile, ssl_certfile, ssl_keyfile, sasl_mechanism, sasl_plain_username, sasl_plain_password, "
               "...); see docs/operations.md"),
    _flag("--kafka_client", default=DEFAULT_CLIENT, choices=list(CLIENTS),
          help="Kafka client library of the python reader and of every producer: confluent (confluent-kafka/"
               "librdkafka, several times faster) or kafka-python (pure Python); --kafka_config keys are "
               "translated for confluent: see docs/operations.md"),
    _flag("--kafka_io", WINDOWED, default="python", choices=["python", "sdf", "xlang"],
          help="python: bounded runs (read to the end of the log, then release), on any runner; sdf (esa shuffle, "
               "and the shuffle step of esa run): one streaming pipeline with an unbounded Python source that runs "
               "until stopped (PrismRunner, or FlinkRunner/DataflowRunner with --streaming; the in-process runner "
               "needs --stop_after_idle_seconds); xlang: bounded runs read by Beam's Java KafkaIO through an "
               "expansion service assembled from Maven, on FlinkRunner only: see docs/deployment.md"),
    _flag("--stop_after_idle_seconds", WINDOWED, type=float, default=None,
          help="--kafka_io sdf: finish once no record arrived for this long on any partition (default: never; "
               "required on the local runners, which run the source to completion before the stages after it)"),
)

FLINK_STREAMING = (
    _flag("--checkpointing_interval", WINDOWED, type=int, default=-1,
          help="Flink: milliseconds between checkpoints (-1: the cluster's setting); needed by --kafka_io sdf on "
               "Flink, whose offsets are committed on checkpoints"),
    _flag("--finish_bundle_before_checkpointing", WINDOWED, action="store_true", default=False,
          help="Flink: finish a bundle before a checkpoint's barrier rather than buffer its outputs in the "
               "checkpoint (Beam's finishBundleBeforeCheckpointing); --kafka_io sdf sets it on Flink by itself: "
               "see docs/deployment.md, the stalled read"),
    _flag("--savepoint_path", frozenset({"shuffle"}), default=None, metavar="URL",
          help="Flink, --kafka_io sdf: resume the streaming job from this savepoint (the one a suspended run, "
               "SIGUSR1, printed): its open windows included, the accounting continued; see docs/deployment.md"),
)

ESA = (
    _flag("--spec", action="append", default=[], help="analysis spec TOML (repeatable)"),
    _flag("--output_dir", default="out",
          help="local or mounted directory of the analyst's outputs (estimates, dead-letter reasons); a URL is "
               "refused (estimates are written with atomic renames)"),
    _flag("--seed", frozenset({"run", "encode", "shuffle"}), type=int, default=None,
          help="seed all randomness (tests and simulations ONLY; default: OS entropy)"),
)

SERVICE = (
    _flag("--state_dir", default="",
          help="the job's durable state: lock, release ledger, resume offsets (default: OUTPUT_DIR.state, beside "
               "the output directory; `esa run` keeps each job's in STATE_DIR/<stage>); one state dir per running "
               "job: give each job its own"),
    _flag("--keys_dir", default="", help="keys directory (default: OUTPUT_DIR.keys, beside the output directory); "
                                        "see docs/operations.md for its layout"),
    _flag("--follow", action="store_true", help="keep running: one bounded run after another until SIGINT/SIGTERM"),
    _flag("--poll_seconds", type=float, default=5.0, help="--follow: pause between runs"),
    _flag("--adopt_consumer_group", action="store_true",
          help="let a new state dir start from the consumer group's committed offsets (refused by default: the "
               "group may belong to another job)"),
    _flag("--drain", WINDOWED, action="store_true",
          help="release every open window at the end of this run (later reports are late)"),
    _flag("--out_of_orderness_seconds", WINDOWED, type=int, default=600,
          help="watermark = max event time seen - this (per partition, min over partitions)"),
    _flag("--idle_timeout_seconds", WINDOWED, type=int, default=300,
          help="a partition without new data for this long no longer holds the watermark back"),
    _flag("--max_age_seconds", WINDOWED, type=int, default=30 * 86400,
          help="reports with an event time older than this are refused at ingress"),
    _flag("--max_skew_seconds", WINDOWED, type=int, default=3600,
          help="reports with an event time this far in the future are refused at ingress"),
    _flag("--crypto_threads", type=int, default=0,
          help="threads per worker for signatures and sealing (0 = one per core, 1 = none)"),
    _flag("--python_gc", choices=["tuned", "default"], default="tuned",
          help="the workers' garbage collector: tuned (freeze what start-up allocated, collect the young "
               "generation every 100,000 objects) or Python's default"),
    _flag("--metrics_port", type=int, default=0,
          help="--follow: serve Prometheus metrics on /metrics and health on /healthz at this port (0 = off); see "
               "docs/operations.md"),
    _flag("--metrics_host", default="127.0.0.1",
          help="address the metrics endpoint listens on (0.0.0.0: every interface)"),
)

# (title of the help section, flags); the keys name the pipelines.options class that registers them with Beam.
GROUPS: dict[str, tuple[str, tuple[Flag, ...]]] = {
    "EsaOptions": ("what to analyze and where results go", ESA),
    "EsaKafkaOptions": ("where the streams are", KAFKA),
    "EsaServiceOptions": ("state, keys, windows, service", SERVICE),
    "EsaFlinkStreamingOptions": ("Flink, for --kafka_io sdf", FLINK_STREAMING),
}


def add_flags(parser: Any, flags: tuple[Flag, ...], job: str | None = None) -> None:
    """Add ``flags`` to ``parser`` (an argparse parser or group): all of them, or only those ``job`` uses."""
    for flag in flags:
        if job is None or job in flag.jobs:
            parser.add_argument(flag.name, **flag.kwargs)


def flags_of(job: str) -> list[str]:
    """The esa flags ``job`` uses, in help order."""
    return [f.name for _, flags in GROUPS.values() for f in flags if job in f.jobs]


def esa_parser(prog: str, job: str | None = None, **kwargs: Any) -> argparse.ArgumentParser:
    """An argparse parser of the esa job flags (of ``job`` only, if given), with ``--runner``: no Beam."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, **kwargs)
    for title, flags in GROUPS.values():
        if job is None or any(job in f.jobs for f in flags):
            add_flags(parser.add_argument_group(title), flags, job)
    return parser
