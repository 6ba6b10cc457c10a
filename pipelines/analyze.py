"""Analyze job: signed release batches (shuffled topic) -> estimates with errors and a privacy ledger.

The analyst's trust domain: it holds the analyzer's private keys and the shuffler's public keys, never a
device identity or a raw event. One run: read from the resume offsets, verify and assemble whole releases
(``transforms.analyzer.releases``), open and decode them into count arrays, compute the estimate rows and
stage them; then, in the driver, for each staged release: seal it in the analyst's ledger (so a replayed
or second release of the same window is never analyzed), compute the population's cumulative epsilon
across the windows released so far (the odometer), write the rows as their own Parquet part under
``OUTPUT_DIR/estimates/`` (append-only, idempotent: a rerun finds the part and writes nothing) and to the
estimates topic keyed ``release_id:item`` if configured. Dead letters here hold no bytes: reason and
position only. Accounting (in Kafka records = release batches):
read = dead-lettered + re-read + duplicate + held + analyzed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.job import (
    DEAD_LETTERS,
    BoundedRun,
    finish_run,
    keep_dead_letters,
    locked,
    nothing_to_do,
    plan_run,
    require_outputs,
    run_pipeline,
    skipped_summary,
)
from pipelines.job_config import JobConfig, RunSummary, config_from_options, refuse_streaming
from pipelines.targets import estimates_target
from transforms.analyzer.estimates import estimate_rows
from transforms.analyzer.ledger_rows import Odometers
from transforms.analyzer.release_step import UnanalysableRelease, record_failed_release, write_release
from transforms.analyzer.releases import DEAD, HELD, AssembleReleaseFn, DecodeReleaseFn, OpenBatchFn, OpenedRelease
from transforms.io.sinks import StageAvroRecords
from transforms.io.staging import StageFn, load_staged
from transforms.runtime.faults import crash_point
from transforms.spec import SpecSet
from transforms.state.ledger import ReleaseLedger
from transforms.state.prior_runs import prior_runs

LOG = logging.getLogger(__name__)
STAGE = "analyze"


def _rows(opened: OpenedRelease, specs: dict) -> tuple[OpenedRelease, list[dict[str, Any]]]:
    spec = specs[opened.spec_id]
    start = opened.window_end_ms - spec.window_seconds * 1000
    rows = estimate_rows(spec, opened.crowd_id, opened.accumulator, start, opened.window_end_ms)
    return opened._replace(accumulator=None), rows


def build(pipeline: beam.Pipeline, run: BoundedRun, ledger: ReleaseLedger) -> None:
    config = run.config
    specs = list(config.specs)
    prior = prior_runs(run.state, (e for s in specs for e in ledger.entries(s.spec_id)), run.key)
    keys = str(config.keys)
    decoded = (pipeline | "ReadShuffled" >> run.reader()
               | "DecodeReleases" >> beam.ParDo(DecodeReleaseFn(specs, keys, prior, run.now_ms))
               .with_outputs(DEAD, HELD, main="batches"))
    assembled = (decoded.batches
                 | "OpenBatches" >> beam.ParDo(OpenBatchFn(specs, keys, config.crypto_threads, config.python_gc))
                 | "GroupRelease" >> beam.GroupByKey()
                 | "Assemble" >> beam.ParDo(AssembleReleaseFn(specs)).with_outputs(DEAD, HELD, main="releases"))
    by_id = SpecSet(specs)
    staging = str(run.staging)
    _ = (assembled.releases
         | "EstimateRows" >> beam.Map(_rows, by_id)
         | "StageEstimates" >> beam.ParDo(StageFn(staging, "release", lambda kv: kv[0].release_id)))
    _ = ((decoded[HELD], assembled[HELD]) | "AllHeld" >> beam.Flatten() | "EarliestHeld" >> beam.CombinePerKey(min)
         | "StageHeld" >> beam.ParDo(StageFn(staging, "held", lambda kv: kv[0].replace("/", "_"))))
    _ = ((decoded[DEAD], assembled[DEAD]) | "AllDead" >> beam.Flatten()
         | "StageDeadLetters" >> StageAvroRecords(run.staging, DEAD_LETTERS, "DeadLetter"))


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    """One bounded run of the analyzer (see the module doc)."""
    config = config.with_group(STAGE)
    started = time.perf_counter()
    with locked(config, STAGE):
        ledger = ReleaseLedger(config.state_layout.ledger)
        bounded = plan_run(config, STAGE, config.shuffled_topic, options)
        if nothing_to_do(bounded, windowed=False):  # held batches wait for the rest of their release
            return skipped_summary(bounded, started)
        require_outputs(config, STAGE, [config.estimates_topic])
        counters = run_pipeline(lambda p: build(p, bounded, ledger), options)
        crash_point("analyze:after_pipeline")
        written, known, failed, epsilons, odometers = 0, {}, [], {}, Odometers()
        target, specs = estimates_target(config), SpecSet(config.specs)
        for opened, rows in sorted(load_staged(bounded.staging, "release"), key=lambda r: r[0].window_end_ms):
            try:
                written += write_release(target, specs[opened.spec_id], ledger, opened, rows, bounded.key, known,
                                         odometers, epsilons)
            except UnanalysableRelease as err:
                failed.append(record_failed_release(target, opened, bounded.key, str(err)))
                odometers = Odometers()  # a failure may leave a carried odometer half updated: rebuild
        bounded.observed["releases_failed"] = len(failed)
        bounded.observed["epsilon"] = epsilons
        keep_dead_letters(bounded, config.state_layout.dead_letters)
        held = {k: v for k, v in load_staged(bounded.staging, "held")}
        finish_run(bounded, held, {})
    parts = {"dead_lettered": counters.get("dead_lettered", 0), "reread": counters.get("records_reread", 0),
             "duplicate": counters.get("batches_duplicate", 0), "held": counters.get("batches_held", 0),
             "analyzed": counters.get("batches_analyzed", 0),
             # a second shuffler's conflicting releases: dead-lettered with their reason, but nothing was lost
             "set_aside": counters.get("batches_set_aside", 0)}
    return RunSummary(counters, config.out_dir, time.perf_counter() - started, STAGE, parts,
                      {"releases_written": written, "run_key": bounded.key, "progress": bounded.observed},
                      dead_letters_dir=config.state_layout.dead_letters)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa analyze --spec X.toml --kafka_bootstrap H:P --shuffled_topic S --output_dir D ...``"""
    options = PipelineOptions(list(argv))
    config = config_from_options(options)
    refuse_streaming(config, "analyze")
    return run(config, options)
