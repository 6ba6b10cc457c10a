"""Pipeline options of the esa jobs (``--flag value`` on the command line, or set from code)."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions


class EsaKafkaOptions(PipelineOptions):
    """Where the streams are."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--kafka_bootstrap", default="127.0.0.1:9092",
                            help="Kafka bootstrap servers (host:port[,host:port])")
        parser.add_argument("--raw_topic", default="telemetry", help="topic of TelemetryEvent records")
        parser.add_argument("--reports_topic", default="",
                            help="topic of device-encoded Report records (default: none)")
        parser.add_argument("--shuffled_topic", default="shuffled",
                            help="topic of ShuffledReport records between the shuffle and analyze jobs")
        parser.add_argument("--consumer_group", default="esa-end-to-end",
                            help="consumer group whose committed offsets bound the read")
        parser.add_argument("--dead_letter_topic", default="", help="also publish dead letters here ('' = off)")
        parser.add_argument("--estimates_topic", default="", help="also publish estimates here ('' = off)")
        parser.add_argument("--kafka_io", default="python", choices=["python", "xlang"],
                            help="python: kafka-python source (DirectRunner); xlang: Beam's Java KafkaIO "
                                 "(Dataflow/Flink, needs an expansion service)")


class EsaOptions(PipelineOptions):
    """What to analyze and where results go."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--spec", action="append", default=[],
                            help="analysis spec TOML (repeatable)")
        parser.add_argument("--output_dir", default="out", help="directory for Parquet/Avro outputs")
        parser.add_argument("--seed", type=int, default=None,
                            help="seed all randomness (tests and simulations ONLY; default: OS entropy)")


def local_runner_requested(options: PipelineOptions) -> bool:
    """True when no runner or the DirectRunner is asked for: we then pin the FnApiRunner.

    The default DirectRunner first tries to download the Prism runner, which cannot work offline.
    """
    runner = options.view_as(StandardOptions).runner
    return runner is None or str(runner) in {"DirectRunner", "FnApiRunner", "SwitchingDirectRunner"}
