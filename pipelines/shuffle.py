"""Shuffle job: Reports -> anonymous, thresholded, permuted ShuffledReports (the shuffler's trust domain).

Reads the reports topic (device-encoded or from the encode job), applies ``transforms.shuffle.Shuffle``
per spec and writes each released report as its own ShuffledReport message, in the permuted order,
without a Kafka key: no client id, no key, no exact time leaves this job. Accounting:
read = dead-lettered + deleted + released.
"""

from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.job import (
    JobConfig,
    RunSummary,
    Sources,
    config_from_options,
    execute,
    reports_of,
    write_dead_letters,
)
from schemas import encode_record
from transforms.encode import DecodeReports
from transforms.kafkaio import WriteToKafka
from transforms.mechanisms.base import Mechanism
from transforms.records import ShuffledBatch, shuffled_records
from transforms.shuffle import Shuffle


def shuffled_messages(batch: ShuffledBatch, mechanism: Mechanism) -> list[bytes]:
    """One keyless ShuffledReport message per released report, in the batch's random order."""
    return [encode_record("ShuffledReport", record, check=False) for record in shuffled_records(mechanism, batch)]


def build(sources: Sources) -> None:
    config = sources.config
    if not config.reports_topic:
        raise ValueError("the shuffle job needs --reports_topic")
    specs = list(config.specs)
    reports, dead_decode = sources.read(config.reports_topic, "ReadReports") | "Decode" >> DecodeReports(specs)
    dead = [dead_decode]
    for i, spec in enumerate(specs):
        mine = reports | f"Select{i}" >> beam.FlatMap(reports_of, spec.spec_id)
        released, dead_shuffle = mine | f"Shuffle{i}" >> Shuffle(spec, seed=config.seed)
        dead.append(dead_shuffle)
        _ = (released
             | f"ToShuffledReports{i}" >> beam.FlatMap(shuffled_messages, spec.randomizer)
             | f"WriteShuffled{i}" >> WriteToKafka(config.bootstrap, config.shuffled_topic))
    write_dead_letters(config, dead)


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    return execute(config, build, "shuffle", options)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa shuffle --spec X.toml --kafka_bootstrap H:P --reports_topic R --shuffled_topic S ...``"""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
