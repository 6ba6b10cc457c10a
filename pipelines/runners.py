"""Which runner a job asks for, what that runner needs from outside Python, and where ``--streaming`` applies.

Beam finds a runner's outside parts itself by downloading them from fixed URLs at run time (Prism's binary
from a GitHub release, Flink's job server jar over plain HTTP). Neither works on a machine that reaches only
package registries, and a production job should not fetch code at start-up anyway. So the esa commands fill
them in from the project's cache (``pipelines.artifacts``), fetched once by the registries' own clients:

- PrismRunner: ``--prism_location`` defaults to Prism built with ``go install`` at this Beam's version.
- FlinkRunner: with Beam 2.62.0 and ``--flink_version 1.19`` (its default), the job server assembled from
  Maven (``pipelines.flink_job_server``) is started for this process on loopback and stopped at its exit;
  with another Beam, ``--flink_job_server_jar`` defaults to ``beam-runners-flink-<flink minor>-job-server`` at
  this Beam's version, fetched with ``mvn`` (the SDK and the job server must be the same Beam version). Given
  ``--flink_job_server_jar`` or ``--job_endpoint`` (a job server the operator runs), nothing is started.

``--streaming`` means one unbounded pipeline, which only the streaming shuffler is, and which only a runner
that runs stages side by side can execute: anywhere else it is refused with one line, never ignored.
"""

from __future__ import annotations

import apache_beam
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    PipelineOptions,
    PortableOptions,
    PrismRunnerOptions,
    StandardOptions,
)

from pipelines.artifacts import ArtifactUnavailableError, go_binary, maven_jar
from pipelines.exit_codes import ConfigError
from pipelines.flink_job_server import BEAM_VERSION as ASSEMBLED_BEAM
from pipelines.flink_job_server import FLINK_MINOR as ASSEMBLED_FLINK
from pipelines.flink_job_server import shared_job_server
from pipelines.kafka_expansion import kafka_io_libs
from pipelines.options import EsaKafkaOptions, local_runner_requested

BEAM_VERSION = apache_beam.__version__
PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
STREAMING_RUNNERS = {"PrismRunner", "FlinkRunner", "DataflowRunner", "PortableRunner"}
FINALIZES_ONLY_WHEN_STREAMING = {"FlinkRunner", "DataflowRunner"}


def runner_name(options: PipelineOptions) -> str:
    """``FlinkRunner`` for ``--runner FlinkRunner`` or its dotted path; ``""`` for none."""
    return str(options.view_as(StandardOptions).runner or "").rsplit(".", 1)[-1]


def flink_job_server_coordinates(flink_version: str, beam_version: str = BEAM_VERSION) -> str:
    return f"org.apache.beam:beam-runners-flink-{flink_version}-job-server:{beam_version}"


def prism_binary(beam_version: str = BEAM_VERSION) -> str:
    """Prism at this Beam's version, from the cache or built with ``go install`` (ConfigError if it cannot)."""
    try:
        return str(go_binary(PRISM_PACKAGE, f"v{beam_version}", "prism"))
    except ArtifactUnavailableError as err:
        raise ConfigError(f"PrismRunner: {err}; give --prism_location PATH of a prism binary") from None


def flink_job_server_jar(flink_version: str, beam_version: str = BEAM_VERSION) -> str:
    """Beam's Flink job server jar from the cache or Maven (ConfigError naming the artifact if it cannot)."""
    coordinates = flink_job_server_coordinates(flink_version, beam_version)
    try:
        return str(maven_jar(coordinates))
    except ArtifactUnavailableError as err:
        raise ConfigError(f"FlinkRunner: Beam's Flink job server {err}; give --flink_job_server_jar JAR (built "
                          f"for Beam {beam_version}, Flink {flink_version}) or --job_endpoint of a running one "
                          "(see docs/deployment.md)") from None


def check_streaming(options: PipelineOptions) -> None:
    """``--streaming`` only where it runs one unbounded pipeline; the streaming shuffler with it where the runner
    commits offsets only in streaming mode."""
    streaming = bool(options.view_as(StandardOptions).streaming)
    kafka_io, runner = options.view_as(EsaKafkaOptions).kafka_io, runner_name(options)
    if streaming and kafka_io != "sdf":
        raise ConfigError("--streaming: only the streaming shuffler (esa shuffle --kafka_io sdf) is one unbounded "
                          "pipeline; this job reads bounded runs and would ignore it: drop --streaming")
    if streaming and (local_runner_requested(options) or runner not in STREAMING_RUNNERS):
        raise ConfigError(f"--streaming: the {runner or 'in-process'} runner cannot run an unbounded pipeline "
                          "(it runs the source to completion first); use --runner PrismRunner here, or FlinkRunner "
                          "or DataflowRunner on a cluster")
    if kafka_io == "sdf" and not streaming and runner in FINALIZES_ONLY_WHEN_STREAMING:
        raise ConfigError(f"--kafka_io sdf on {runner} needs --streaming: the runner commits the source's offsets "
                          "when it finalizes bundles, which it does in streaming mode only")


def prepare_runner(options: PipelineOptions) -> None:
    """Check ``--streaming`` and fill in the chosen runner's outside parts (in place, on ``options``)."""
    check_streaming(options)
    runner = runner_name(options)
    if runner == "PrismRunner":
        prism = options.view_as(PrismRunnerOptions)
        if not prism.prism_location:
            prism.prism_location = prism_binary()
    elif runner == "FlinkRunner":
        flink, portable = options.view_as(FlinkRunnerOptions), options.view_as(PortableOptions)
        if flink.flink_job_server_jar or portable.job_endpoint:
            return  # the operator's job server
        if BEAM_VERSION == ASSEMBLED_BEAM and flink.flink_version == ASSEMBLED_FLINK:
            xlang = options.view_as(EsaKafkaOptions).kafka_io == "xlang"
            portable.job_endpoint = assembled_job_server(flink.flink_master, kafka_io=xlang)
        else:
            flink.flink_job_server_jar = flink_job_server_jar(flink.flink_version)


def assembled_job_server(flink_master: str, kafka_io: bool = False) -> str:
    """The job server assembled from Maven (``pipelines.flink_job_server``), started for this process; with
    ``kafka_io``, Java KafkaIO's jars on its class path (``--kafka_io xlang``)."""
    try:
        extra = kafka_io_libs() if kafka_io else ""
        return shared_job_server(flink_master or "[auto]", extra_libs=extra).endpoint
    except (ArtifactUnavailableError, RuntimeError) as err:
        raise ConfigError(f"FlinkRunner: {err}; give --job_endpoint of a running job server "
                          "(see docs/deployment.md)") from None
