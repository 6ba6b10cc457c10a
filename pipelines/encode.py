"""Encode job: raw TelemetryEvents -> signed, sealed message sets on the reports topic (edge collectors).

The device's trust domain (an edge collector or a simulation holding the devices' keys): each event is
randomized once with the keyed per-event PRF of ``transforms.encoder.encode`` under the encoder's persisted key
(its permanent backstops with a PRF of the device and value, the same in every run: docs/device-privacy.md),
its payloads are sealed to the analyzer and the set is signed with the device's key
(``transforms.encoder.seal``), so a rerun after a crash re-sends byte-identical sets (the shuffler keeps one).
The Kafka key is the device id, so one device's sets stay in order in one partition. Raw dead letters stay
here (``STATE/dead_letters``). Accounting: read = dead-lettered + encoded.

A run's sets are written in one Kafka transaction (``transforms.io.kafka.writer``): the pipeline stages
them (``STATE/staging/<run>.<attempt>/sets-*``) and the driver, once it succeeded, writes them all and commits, so a
read_committed shuffler sees a run whole or not at all, and plans its reads up to the last stable offset:
never past a set a run still open may add (issue 34, K1). A crash before the commit aborts it (nothing
visible; the rerun writes the same bytes); after it, the rerun writes them again and the shuffler keeps one.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.exit_codes import JobUsageError
from pipelines.job import (
    DEAD_LETTERS,
    BoundedRun,
    finish_run,
    keep_dead_letters,
    locked,
    plan_run,
    require_outputs,
    run_pipeline,
)
from pipelines.job_config import JobConfig, RunSummary, config_from_options, refuse_streaming
from transforms.encoder.encode import EncodeEvents
from transforms.encoder.keys import EncoderKeys
from transforms.encoder.seal import SealSetsFn
from transforms.io.kafka.writer import KafkaTarget, TransactionalWriter
from transforms.io.sinks import StageAvroRecords
from transforms.io.staging import StageFn, iter_staged
from transforms.state.files import create_exclusive

STAGE = "encode"
SETS = "sets"  # the staged sealed sets' file prefix
TRANSACTIONAL_PREFIX = "esa-encoder"  # pipelines.broker.acls grants the edge principal this prefix


def _batch_name(batch: list[tuple[bytes, bytes]]) -> str:
    """A batch's stable name: the digest of its sets (a retried bundle stages the same bytes, the same name)."""
    digest = hashlib.sha256()
    for _, value in batch:
        digest.update(len(value).to_bytes(4, "big"))
        digest.update(value)
    return digest.hexdigest()


def transactional_id(config: JobConfig) -> str:
    """This state directory's own transactional id, drawn once and kept in it: two edge encoders writing one
    reports topic never fence each other; a restarted one fences (and aborts) its earlier self."""
    path = config.state / "transactional.id"
    create_exclusive(path, f"{TRANSACTIONAL_PREFIX}-{secrets.token_hex(8)}".encode())  # no-op when it exists
    return path.read_text().strip()


def _staged_sets(staging: str) -> Iterator[tuple[bytes, bytes]]:
    for batch in iter_staged(staging, SETS):
        yield from batch


def write_run(config: JobConfig, run: BoundedRun) -> int:
    """Write the run's staged sets to the reports topic in one transaction (after the pipeline succeeded)."""
    target = KafkaTarget.of(config.bootstrap, str(config.reports_topic), config.kafka_config, config.kafka_client)
    writer = TransactionalWriter(target, transactional_id(config))
    try:
        return writer.write(_staged_sets(run.staging))
    finally:
        writer.close()


def encoder_key(config: JobConfig) -> EncoderKeys:
    """Sub-keys of the encoder's persisted secret; a test seed replaces it only when given."""
    if config.seed is not None:
        return EncoderKeys.from_seed(config.seed)
    return EncoderKeys.from_keys_dir(config.keys)


def build(pipeline: beam.Pipeline, run: BoundedRun) -> None:
    config = run.config
    specs = list(config.specs)
    reports, dead = (pipeline | "ReadRaw" >> run.reader()
                     | "Encode" >> EncodeEvents(specs, encoder_key(config), batched_input=True))
    _ = (reports
         | "SealAndSign" >> beam.ParDo(SealSetsFn(specs, str(config.keys), config.crypto_threads,
                                                          config.python_gc))
         | "StageSets" >> beam.ParDo(StageFn(run.staging, SETS, _batch_name)))
    _ = dead | "StageDeadLetters" >> StageAvroRecords(run.staging, DEAD_LETTERS, "DeadLetter")


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    if not config.reports_topic:
        raise JobUsageError("the encode job needs --reports_topic")
    config = config.with_group(STAGE)
    started = time.perf_counter()
    with locked(config, STAGE):
        bounded = plan_run(config, STAGE, config.raw_topic, options)
        require_outputs(config, STAGE, [config.reports_topic])  # before anything is sealed
        counters = run_pipeline(lambda p: build(p, bounded), options)
        written = write_run(config, bounded)
        counters["kafka_records_written"] = written
        keep_dead_letters(bounded, config.state_layout.dead_letters)
        finish_run(bounded, {}, {})
    parts = {"dead_lettered": counters.get("dead_lettered", 0), "encoded": counters.get("events_encoded", 0)}
    return RunSummary(counters, config.out_dir, time.perf_counter() - started, STAGE, parts,
                      {"run_key": bounded.key, "progress": bounded.observed},
                      dead_letters_dir=config.state_layout.dead_letters)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa encode --spec X.toml --kafka_bootstrap H:P --raw_topic T --reports_topic R ...``"""
    options = PipelineOptions(list(argv))
    config = config_from_options(options)
    refuse_streaming(config, "encode")
    return run(config, options)
