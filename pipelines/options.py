"""Pipeline options of the esa jobs (``--flag value`` on the command line, or set from code)."""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.exit_codes import ConfigError
from transforms.io.kafka.config import CLIENTS, DEFAULT_CLIENT, KafkaConfigError
from transforms.io.kafka.config import validate as validate_kafka_config


class EsaKafkaOptions(PipelineOptions):
    """Where the streams are."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--kafka_bootstrap", default="127.0.0.1:9092",
                            help="Kafka bootstrap servers (host:port[,host:port])")
        parser.add_argument("--raw_topic", default="telemetry", help="topic of TelemetryEvent records")
        parser.add_argument("--reports_topic", default="reports",
                            help="topic of signed message sets: written by devices (or `esa encode`), read by "
                                 "`esa shuffle`")
        parser.add_argument("--devices_topic", default="devices",
                            help="compacted topic of device enrolments (keyed by device id), read by `esa shuffle` "
                                 "into its device store at the start of each run ('' = only the legacy "
                                 "KEYS/registry/devices.parquet); see docs/operations.md")
        parser.add_argument("--shuffled_topic", default="shuffled",
                            help="topic of signed release batches between the shuffle and analyze jobs")
        parser.add_argument("--consumer_group", default="",
                            help="consumer group the job commits its read offsets to (default: the job's own, "
                                 "esa-encode, esa-shuffle or esa-analyze, the groups the documented ACLs grant)")
        parser.add_argument("--dead_letter_topic", default="",
                            help="also publish dead letters to PREFIX-encode, PREFIX-shuffle or PREFIX-analyze, "
                                 "the topic of the job's own trust domain ('' = off; the analyzer's hold no raw "
                                 "bytes); see docs/operations.md")
        parser.add_argument("--create_topics", action="store_true",
                            help="create the topics this job writes if they are missing (default: refuse to start "
                                 "and name them, so a typo is never created and published to)")
        parser.add_argument("--estimates_topic", default="", help="also publish estimates here ('' = off)")
        parser.add_argument("--kafka_config", default="", metavar="FILE",
                            help="file of extra Kafka client settings, one key=value per line (TLS/SASL: "
                                 "security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile, sasl_mechanism, "
                                 "sasl_plain_username, sasl_plain_password, ...); see docs/operations.md")
        parser.add_argument("--kafka_client", default=DEFAULT_CLIENT, choices=list(CLIENTS),
                            help="Kafka client library of the python reader and of every producer: confluent "
                                 "(confluent-kafka/librdkafka, several times faster) or kafka-python (pure Python); "
                                 "--kafka_config keys are translated for confluent: see docs/operations.md")
        parser.add_argument("--kafka_io", default="python", choices=["python", "sdf", "xlang"],
                            help="python: bounded runs (read to the end of the log, then release), on any runner; "
                                 "sdf (esa shuffle, and the shuffle step of esa run): one streaming pipeline with an "
                                 "unbounded Python source that runs until stopped (PrismRunner, or FlinkRunner/"
                                 "DataflowRunner with --streaming; the in-process runner needs "
                                 "--stop_after_idle_seconds); xlang: Beam's Java KafkaIO, refused: see "
                                 "docs/deployment.md")
        parser.add_argument("--stop_after_idle_seconds", type=float, default=None,
                            help="--kafka_io sdf: finish once no record arrived for this long on any partition "
                                 "(default: never; required on the local runners, which run the source to "
                                 "completion before the stages after it)")


class EsaFlinkStreamingOptions(PipelineOptions):
    """Flink's checkpoint interval for ``--kafka_io sdf`` (the Flink runner finalizes bundles, hence commits the
    source's offsets, when a checkpoint completes). Declared here because the esa commands refuse flags no
    options class declares; the value reaches the Flink job server as Beam's ``checkpointingInterval``."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--checkpointing_interval", type=int, default=-1,
                            help="Flink: milliseconds between checkpoints (-1: the cluster's setting); needed by "
                                 "--kafka_io sdf on Flink, whose offsets are committed on checkpoints")


class EsaOptions(PipelineOptions):
    """What to analyze and where results go."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--spec", action="append", default=[],
                            help="analysis spec TOML (repeatable)")
        parser.add_argument("--output_dir", default="out",
                            help="local or mounted directory of the analyst's outputs (estimates, dead-letter "
                                 "reasons); a URL is refused (estimates are written with atomic renames)")
        parser.add_argument("--seed", type=int, default=None,
                            help="seed all randomness (tests and simulations ONLY; default: OS entropy)")


class EsaServiceOptions(PipelineOptions):
    """How a job keeps its state across runs, where its keys are, and when windows close."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--state_dir", default="",
                            help="the job's durable state: lock, release ledger, resume offsets (default: "
                                 "OUTPUT_DIR.state, beside the output directory; `esa run` keeps each job's in "
                                 "STATE_DIR/<stage>); one state dir per running job: give each job its own")
        parser.add_argument("--keys_dir", default="", help="keys directory (default: OUTPUT_DIR.keys, beside the "
                                                           "output directory); see docs/operations.md for its layout")
        parser.add_argument("--follow", action="store_true",
                            help="keep running: one bounded run after another until SIGINT/SIGTERM")
        parser.add_argument("--poll_seconds", type=float, default=5.0, help="--follow: pause between runs")
        parser.add_argument("--adopt_consumer_group", action="store_true",
                            help="let a new state dir start from the consumer group's committed offsets (refused "
                                 "by default: the group may belong to another job)")
        parser.add_argument("--drain", action="store_true",
                            help="release every open window at the end of this run (later reports are late)")
        parser.add_argument("--out_of_orderness_seconds", type=int, default=600,
                            help="watermark = max event time seen - this (per partition, min over partitions)")
        parser.add_argument("--idle_timeout_seconds", type=int, default=300,
                            help="a partition without new data for this long no longer holds the watermark back")
        parser.add_argument("--max_age_seconds", type=int, default=30 * 86400,
                            help="reports with an event time older than this are refused at ingress")
        parser.add_argument("--max_skew_seconds", type=int, default=3600,
                            help="reports with an event time this far in the future are refused at ingress")
        parser.add_argument("--crypto_threads", type=int, default=0,
                            help="threads per worker for signatures and sealing (0 = one per core, 1 = none)")
        parser.add_argument("--python_gc", choices=["tuned", "default"], default="tuned",
                            help="the workers' garbage collector: tuned (freeze what start-up allocated, "
                                 "collect the young generation every 100,000 objects) or Python's default")
        parser.add_argument("--metrics_port", type=int, default=0,
                            help="--follow: serve Prometheus metrics on /metrics and health on /healthz at this "
                                 "port (0 = off); see docs/operations.md")
        parser.add_argument("--metrics_host", default="127.0.0.1",
                            help="address the metrics endpoint listens on (0.0.0.0: every interface)")


def kafka_client_config(path: str | os.PathLike[str]) -> dict[str, object]:
    """Read ``key=value`` lines (``#`` comments) into kafka client settings; numbers become ints.

    Kept in a file, not on the command line, so that passwords do not show in ``ps``. A file that cannot be
    read or a line that is not ``key=value`` is a ConfigError (exit 3) naming the file (and the line).
    """
    if not path:
        return {}
    out: dict[str, object] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--kafka_config {path}: cannot read it: {getattr(err, 'strerror', None) or err}") from None
    for number, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka_config {path}:{number}: expected key=value, got {line!r}")
        value = value.strip()
        out[key.strip().replace(".", "_")] = int(value) if value.isdigit() else value
    return out


def load_kafka_config(path: str | os.PathLike[str], client: str) -> dict[str, object]:
    """``--kafka_config FILE`` read and checked for ``client`` now, before any Kafka client exists (every esa
    command that talks to Kafka loads it here, so all refuse a bad file alike: ConfigError, exit 3)."""
    config = kafka_client_config(path)
    try:
        validate_kafka_config(client, config)
    except KafkaConfigError as err:
        raise ConfigError(f"--kafka_config {path}: {err}") from None
    return config


def local_runner_requested(options: PipelineOptions) -> bool:
    """True when no runner or the DirectRunner is asked for: we then pin the FnApiRunner.

    The default DirectRunner first tries to download the Prism runner, which cannot work offline.
    """
    runner = options.view_as(StandardOptions).runner
    return runner is None or str(runner) in {"DirectRunner", "FnApiRunner", "SwitchingDirectRunner"}
