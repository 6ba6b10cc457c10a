"""Pipeline options of the esa jobs (``--flag value`` on the command line, or set from code).

The flags themselves are declared in ``pipelines.job_flags`` (no Beam there, so ``esa JOB --help`` is quick);
these classes register them with Beam.
"""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.exit_codes import ConfigError
from pipelines.job_flags import ESA, FLINK_STREAMING, KAFKA, SERVICE, add_flags
from transforms.io.kafka.config import KafkaConfigError
from transforms.io.kafka.config import validate as validate_kafka_config


class EsaKafkaOptions(PipelineOptions):
    """Where the streams are."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        add_flags(parser, KAFKA)


class EsaFlinkStreamingOptions(PipelineOptions):
    """Flink's checkpoint interval for ``--kafka_io sdf`` (the Flink runner finalizes bundles, hence commits the
    source's offsets, when a checkpoint completes). Declared here because the esa commands refuse flags no
    options class declares; the value reaches the Flink job server as Beam's ``checkpointingInterval``."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        add_flags(parser, FLINK_STREAMING)


def finish_bundles_before_checkpoints(options: PipelineOptions) -> None:
    """Beam's Flink ``finishBundleBeforeCheckpointing`` for a streaming job: a bundle still open when a checkpoint
    starts is finished before the barrier, its outputs sent on. By default they are buffered in the checkpoint
    and sent only when the operator's next bundle starts, and the stage that emits the Kafka read's one element
    (after an ``Impulse`` that never sends anything again) has no next bundle: the read never starts (the
    stalled read, docs/deployment.md)."""
    options.view_as(EsaFlinkStreamingOptions).finish_bundle_before_checkpointing = True


class EsaOptions(PipelineOptions):
    """What to analyze and where results go."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        add_flags(parser, ESA)


class EsaServiceOptions(PipelineOptions):
    """How a job keeps its state across runs, where its keys are, and when windows close."""
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        add_flags(parser, SERVICE)


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
