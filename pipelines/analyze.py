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
from pathlib import Path
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
from pipelines.job_config import JobConfig, RunSummary, config_from_options, crash_point, refuse_streaming
from schemas import encode_record
from transforms.analyzer.estimates import estimate_rows
from transforms.analyzer.ledger_rows import Odometers, event_of, metric_of, with_cumulative_epsilon
from transforms.analyzer.releases import DEAD, HELD, AssembleReleaseFn, DecodeReleaseFn, OpenBatchFn, OpenedRelease
from transforms.io.kafka.bounded import produce_records
from transforms.io.sinks import StageAvroRecords
from transforms.io.staging import StageFn, load_staged
from transforms.spec import SpecSet
from transforms.state.estimate_columns import neighbouring_notion
from transforms.state.estimates_store import write_release_estimates
from transforms.state.files import atomic_write_json
from transforms.state.ledger import ReleaseEntry, ReleaseKey, ReleaseLedger
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


class UnanalysableRelease(Exception):  # noqa: N818 (a verdict on a release, not a program error)
    """A release whose estimates cannot be published (its privacy accounting failed); it was not sealed."""


def record_failed_release(config: JobConfig, opened: OpenedRelease, run_key: str, reason: str) -> Path:
    """Write ``STATE/failed_releases/<release id>.json`` (the operator's record; nothing is published), log it.

    The run goes on and its resume offsets move past the release: it is not retried on its own. An operator
    who fixed the cause replays it by resetting the job (docs/operations.md)."""
    path = config.state_layout.failed_releases / f"{opened.release_id}.json"
    atomic_write_json(path, {"release_id": opened.release_id, "spec_id": opened.spec_id, "crowd_id": opened.crowd_id,
                             "window_end_ms": opened.window_end_ms, "n_sets": opened.n_sets, "reason": reason,
                             "run_key": run_key, "failed_at_ms": int(time.time() * 1000)})
    LOG.error("release %s (window ending %d of %s, crowd %s) cannot be analysed and was not sealed: %s; "
              "recorded in %s, the stream goes on", opened.release_id, opened.window_end_ms, opened.spec_id,
              opened.crowd_id, reason, path)
    return path


def write_release(config: JobConfig, ledger: ReleaseLedger, opened: OpenedRelease, rows: list[dict[str, Any]],
                  run_key: str, known: dict[str, dict[ReleaseKey, ReleaseEntry]] | None = None,
                  odometers: Odometers | None = None,
                  epsilons: dict[tuple[str, str, str], float | None] | None = None) -> bool:
    """Validate (odometer) -> seal (analyst ledger) -> append-only Parquet part -> topic. True if newly written.

    ``known`` caches each metric's ledger entries (of every spec of that metric: the odometer follows the
    devices, not the spec hash) across the releases of one run (this job holds the state directory's lock,
    so only it adds entries): the ledger is listed once per metric and run, not once per release, which made
    a run of many windows quadratic in the ledger's size. ``odometers`` carries each population's composed
    privacy loss from release to release, so a release costs the same after a year as after a week.
    ``epsilons`` collects each population's (spec name, crowd, notion) cumulative epsilon for the metrics.
    A release whose cumulative epsilon cannot be computed raises UnanalysableRelease before it is sealed."""
    spec = next(s for s in config.specs if s.spec_id == opened.spec_id)
    key = ReleaseKey(opened.spec_id, opened.crowd_id, opened.window_end_ms)
    entry = ReleaseEntry(key=key, release_id=opened.release_id, digest=opened.release_id, n_sets=opened.n_sets,
                         n_messages=int(rows[0]["n_reports"]) if rows else 0, batches=0,
                         source_ends=dict(opened.source_ends), run_key=run_key, sealed_at_ms=int(time.time() * 1000),
                         event=event_of(spec, rows))
    known = {} if known is None else known
    if spec.metric not in known:
        known[spec.metric] = {e.key: e for e in ledger.entries() if metric_of(e) == spec.metric}
    # Validate before sealing: a release whose cumulative epsilon cannot be computed must not be sealed as
    # analysed, or every rerun would fail on it again and the stream would jam behind it.
    candidate = {**known[spec.metric], key: known[spec.metric].get(key, entry)}
    population = [e for e in candidate.values() if e.key.crowd_id == opened.crowd_id]
    try:
        rows = with_cumulative_epsilon(spec, rows, population, key.window_end_ms, odometers)
    except Exception as err:
        raise UnanalysableRelease(f"{type(err).__name__}: {err}") from err
    stored, created = ledger.seal(entry)
    if not created and stored.release_id != opened.release_id:
        LOG.error("a second release of window %d of %s was refused", key.window_end_ms, key.spec_id)
        return False
    crash_point("analyze:after_seal")
    known[spec.metric][key] = stored
    if epsilons is not None and rows:
        epsilons[(spec.name, opened.crowd_id or "", neighbouring_notion(rows[0]))] = rows[0]["eps_central_cumulative"]
    for row in rows:
        row["release_id"] = opened.release_id
    _, written = write_release_estimates(config.out_dir, rows, spec_name=spec.name, window_end_ms=key.window_end_ms,
                                         release_id=opened.release_id, kind=spec.kind)
    if config.estimates_topic and stored.status != "published":
        produce_records(config.bootstrap, config.estimates_topic,
                        ((f"{opened.release_id}:{r['item_index']}".encode(), encode_record("Estimate", r, check=False))
                         for r in rows), producer_config=config.kafka_config,
                         client=config.kafka_client)
    crash_point("analyze:after_publish")
    ledger.mark_published(key)
    return written


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
        for opened, rows in sorted(load_staged(bounded.staging, "release"), key=lambda r: r[0].window_end_ms):
            try:
                written += write_release(config, ledger, opened, rows, bounded.key, known, odometers, epsilons)
            except UnanalysableRelease as err:
                failed.append(record_failed_release(config, opened, bounded.key, str(err)))
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
