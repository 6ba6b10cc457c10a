"""Encode job: raw TelemetryEvents -> randomized Reports on the reports topic (edge collectors).

Each event is randomized once, with the keyed per-event PRF of ``transforms.encode``, so a retried bundle
re-sends the same report (the shuffler keeps one per client and window). Accounting:
read = dead-lettered + encoded.
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
    encoder_key,
    execute,
    write_dead_letters,
)
from schemas import encode_record
from transforms.encode import EncodeEvents
from transforms.kafkaio import WriteToKafka
from transforms.records import ReportElement, report_record


def report_messages(batch: list[ReportElement], mechanisms: dict) -> list[tuple[bytes, bytes]]:
    """(Kafka key = client id, Avro Report) per report: the key keeps a client's reports in one partition."""
    return [(r.client_id.encode(), encode_record("Report", report_record(mechanisms[r.spec_id], r), check=False))
            for r in batch]


def build(sources: Sources) -> None:
    config = sources.config
    if not config.reports_topic:
        raise ValueError("the encode job needs --reports_topic")
    specs = list(config.specs)
    mechanisms = {s.spec_id: s.randomizer for s in specs}
    raw = sources.read(config.raw_topic, "ReadRaw")
    reports, dead = raw | "Encode" >> EncodeEvents(specs, encoder_key(config), batched_input=sources.batched)
    _ = (reports
         | "ToReports" >> beam.FlatMap(report_messages, mechanisms)
         | "WriteReports" >> WriteToKafka(config.bootstrap, config.reports_topic))
    write_dead_letters(config, [dead])


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    return execute(config, build, "encode", options)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa encode --spec X.toml --kafka_bootstrap H:P --raw_topic T --reports_topic R ...``"""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
