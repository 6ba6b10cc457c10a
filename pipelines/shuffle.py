"""Shuffle job: signed message sets (reports topic) -> signed release batches (shuffled topic).

The shuffler's trust domain: it holds the device registry, its signing key and its PRF key, never the
analyzer's private key. One run: read from the resume offsets, authenticate, window, hold open windows,
dedupe/threshold/permute closed ones (``transforms.shuffler.graph``), stage the release parts; then, in the
driver, for every staged release: number and sign its batches, write them to ``state/releases/`` (fsync),
**seal** the release in the ledger (create-if-absent), publish the batches keyed by
``release_id:index`` (a replay is a no-op for a compacted consumer), mark it published; finally save the
resume offsets. A sealed but unpublished release found at start (crash between seal and publish) is
republished byte-for-byte from ``state/releases/``. Accounting (in message sets = Kafka records):
read = dead-lettered + re-read + held + deleted + duplicate (copies of a kept set) + released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import stream_shuffle
from pipelines.exit_codes import JobUsageError
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
from pipelines.job_config import JobConfig, RunSummary, config_from_options
from pipelines.registry import catch_up_job, store_path
from pipelines.targets import release_target
from transforms.io.sinks import StageAvroRecords
from transforms.io.staging import (
    StageFn,
    join,
    load_staged,
    stable_name,
)
from transforms.runtime.faults import crash_point
from transforms.shuffler.elements import DEAD, TIMES, VERIFIED, TimePolicy
from transforms.shuffler.graph import ScaleOut, Shuffle, WindowClock
from transforms.shuffler.ingress import IngressFn
from transforms.shuffler.release_step import (
    STAGE,
    part_stager,
    republish_unpublished,
    seal_and_publish,
    shuffler_prf_key,
)
from transforms.state.ledger import ReleaseLedger
from transforms.state.prior_runs import prior_runs
from transforms.state.verified_sets import VerifiedSets

LOG = logging.getLogger(__name__)


def build(pipeline: beam.Pipeline, run: BoundedRun, ledger: ReleaseLedger) -> None:
    config = run.config
    specs = list(config.specs)
    prior = replace(prior_runs(run.state, (e for s in specs for e in ledger.entries(s.spec_id)), run.key),
                    verified=VerifiedSets.load(config.state))
    clock = WindowClock(run.now_ms, config.out_of_orderness_seconds * 1000, config.idle_timeout_seconds * 1000,
                        dict(run.state.max_event_ms), dict(run.state.last_data_wall_ms), config.drain)
    times = TimePolicy(run.now_ms, config.max_age_seconds * 1000, config.max_skew_seconds * 1000)
    registry = str(store_path(config.state))  # caught up by run() before the pipeline (pipelines.registry)
    scale = ScaleOut(sum(r.stop - r.start for r in run.plan))
    subkeys = {s.spec_id: scale.subkeys(s) for s in specs}
    LOG.info("scale-out for %d planned records: %d dedupe buckets, sub-keys %s", scale.records, scale.buckets,
             subkeys)
    staging = str(run.staging)
    spill = join(staging, "spill")  # the sets and units themselves; only references are grouped
    ingress = (pipeline | "ReadReports" >> run.reader()
               | "Ingress" >> beam.ParDo(IngressFn(specs, registry, prior, times, config.crypto_threads,
                                                   scale.buckets, keys_dir=str(config.keys), spill=spill,
                                                   python_gc=config.python_gc))
               .with_outputs(DEAD, TIMES, VERIFIED, main="sets"))
    released, held, dead, run_times = (ingress.sets, ingress[TIMES]) | "Shuffle" >> Shuffle(
        specs, shuffler_prf_key(config.keys, config.seed), clock, subkeys, spill=spill)
    _ = released | "StageParts" >> beam.ParDo(part_stager(staging))
    _ = held | "StageHeld" >> beam.ParDo(StageFn(staging, "held", lambda kv: stable_name(kv[0])))
    _ = run_times | "StageTimes" >> beam.ParDo(StageFn(staging, "time", lambda kv: stable_name(kv[0])))
    _ = ingress[VERIFIED] | "StageVerified" >> beam.ParDo(StageFn(staging, "verified", lambda v: stable_name(
        v[0], v[1][0], len(v[1]))))
    _ = ((ingress[DEAD], dead) | "AllDead" >> beam.Flatten()
         | "StageDeadLetters" >> StageAvroRecords(run.staging, DEAD_LETTERS, "DeadLetter"))


def seal_run(run: BoundedRun, ledger: ReleaseLedger, counts: dict[str, int] | None = None) -> tuple[int, int]:
    """The release step of one bounded run (``transforms.shuffler.release_step.seal_and_publish``): (released,
    refused as already sealed)."""
    return seal_and_publish(release_target(run.config), run.config.specs, run.staging, run.source_ends, run.key,
                            ledger, counts)


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    """One bounded run of the shuffler (see the module doc); ``--kafka_io sdf``: the streaming shuffler
    (``pipelines.stream_shuffle``), which runs until its source stops."""
    config = config.with_group(STAGE)
    if config.kafka_io == "sdf":
        return stream_shuffle.run(config, options)
    started = time.perf_counter()
    with locked(config, STAGE):
        ledger = ReleaseLedger(config.state_layout.ledger)
        if not config.reports_topic:
            raise JobUsageError("the shuffle job needs --reports_topic")
        require_outputs(config, STAGE, [config.shuffled_topic])  # before anything is sealed or republished
        target = release_target(config)
        republish_unpublished(target, ledger)
        bounded = plan_run(config, STAGE, config.reports_topic, options)
        registry = catch_up_job(config)  # after the plan: see pipelines.registry on when an enrolment counts
        if nothing_to_do(bounded, windowed=True):
            return skipped_summary(bounded, started)
        crash_point("shuffle:before_pipeline")
        counters = run_pipeline(lambda p: build(p, bounded, ledger), options)
        crash_point("shuffle:after_pipeline")
        added: dict[str, int] = {}
        releases, conflicts = seal_run(bounded, ledger, added)
        keep_dead_letters(bounded, config.state_layout.dead_letters)
        held = {k: v for k, v in load_staged(bounded.staging, "held")}
        times = {k: v for k, v in load_staged(bounded.staging, "time")}
        checked = [(pkey, offsets, np.frombuffer(digests, dtype=np.uint8))
                   for pkey, offsets, digests in load_staged(bounded.staging, "verified")]
        state = finish_run(bounded, held, times)
        # After the state: a crash in between only means verifying those sets again.
        VerifiedSets.load(config.state).merged(checked, keep_from=state.resume).save(config.state)
    parts = {"dead_lettered": counters.get("dead_lettered", 0), "reread": counters.get("records_reread", 0),
             "held": counters.get("sets_held", 0), "deleted": counters.get("sets_deleted", 0),
             "duplicate": counters.get("sets_duplicate", 0),
             "released": counters.get("sets_released", 0)}
    return RunSummary(counters, config.out_dir, time.perf_counter() - started, STAGE, parts,
                      {"releases": releases, "conflicts": conflicts, "dummies": added.get("dummies", 0),
                       "run_key": bounded.key, "registry": registry.as_dict(),
                       "progress": bounded.observed},
                      dead_letters_dir=config.state_layout.dead_letters)


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa shuffle --spec X.toml --kafka_bootstrap H:P --reports_topic R --shuffled_topic S ...``"""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
