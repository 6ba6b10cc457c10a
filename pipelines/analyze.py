"""Analyze job: ShuffledReports -> per-window estimates with standard errors and the privacy ledger.

Reads the shuffled topic, puts every released report back in its window (from ``window_end``), and runs
``transforms.analyze.Analyze`` per spec. The analyzer never sees a client id; ``n_deleted`` is null here
(the shuffler does not publish deletions on the shuffled topic). Accounting: read = dead-lettered + analyzed.
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
    execute,
    write_dead_letters,
    write_estimates,
)
from transforms.analyze import DEAD, Analyze, DecodeShuffledFn


def build(sources: Sources) -> None:
    config = sources.config
    specs = list(config.specs)
    decoded = (sources.read(config.shuffled_topic, "ReadShuffled")
               | "Decode" >> beam.ParDo(DecodeShuffledFn(specs)).with_outputs(DEAD, main="batches"))
    estimates = []
    for i, spec in enumerate(specs):
        estimates.append(
            decoded.batches
            | f"Select{i}" >> beam.Filter(lambda b, sid=spec.spec_id: b.spec_id == sid)
            | f"Window{i}" >> beam.WindowInto(window.FixedWindows(spec.window_seconds))
            | f"Analyze{i}" >> Analyze(spec)
            | f"EstimatesGlobal{i}" >> beam.WindowInto(window.GlobalWindows()))
    write_estimates(config, estimates)
    write_dead_letters(config, [decoded[DEAD]])


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    return execute(config, build, "analyze", options)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa analyze --spec X.toml --kafka_bootstrap H:P --shuffled_topic S --output_dir D ...``"""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
