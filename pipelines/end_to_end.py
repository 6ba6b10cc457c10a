"""The whole chain in one Beam pipeline: raw topic (and device reports) -> estimates.

    Kafka raw topic ─ decode ▸ encode ─┐
                                       ├─▶ shuffle (per spec) ─▶ analyze ─▶ estimates.parquet [+ topic]
    Kafka reports topic ─ decode ──────┘
    every unusable record ─────────────────────────────────────────────▶ dead_letters.avro [+ topic]

For demos and tests; in production the three stages run as separate jobs (``pipelines/encode.py``,
``shuffle.py``, ``analyze.py``) so the shuffler lives in its own trust domain. Accounting:
read = dead-lettered + deleted (crowd threshold) + analyzed.
"""

from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

from pipelines.job import (
    JobConfig,
    RunSummary,
    Sources,
    config_from_options,
    encoder_key,
    execute,
    reports_of,
    write_dead_letters,
    write_estimates,
)
from transforms.analyze import Analyze
from transforms.encode import DecodeReports, EncodeEvents
from transforms.shuffle import Shuffle


def build(sources: Sources) -> None:
    """Add the end-to-end graph: both input topics, every spec's shuffle and analysis, all outputs."""
    config = sources.config
    specs = list(config.specs)
    raw = sources.read(config.raw_topic, "ReadRaw")
    reports, dead_encode = raw | "Encode" >> EncodeEvents(specs, encoder_key(config), batched_input=sources.batched)
    dead = [dead_encode]
    if config.reports_topic:
        device_reports, dead_device = sources.read(config.reports_topic, "ReadReports") | "DecodeDevice" >> \
            DecodeReports(specs)
        reports = (reports, device_reports) | "AllReports" >> beam.Flatten()
        dead.append(dead_device)
    estimates = []
    for i, spec in enumerate(specs):
        mine = reports | f"Select{i}" >> beam.FlatMap(reports_of, spec.spec_id)
        shuffled, dead_shuffle = mine | f"Shuffle{i}" >> Shuffle(spec, seed=config.seed)
        dead.append(dead_shuffle)
        estimates.append(shuffled | f"Analyze{i}" >> Analyze(spec)
                         | f"EstimatesGlobal{i}" >> beam.WindowInto(window.GlobalWindows()))
    write_estimates(config, estimates)
    write_dead_letters(config, dead)


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    """Run the chain once over what is new on the topics; see ``pipelines.job.execute``."""
    return execute(config, build, "end_to_end", options)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa run --spec X.toml --kafka_bootstrap HOST:PORT ...`` (Beam flags pass through)."""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
