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

import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.exit_codes import JobUsageError
from pipelines.job import (
    DEAD_LETTERS,
    BoundedRun,
    JobConfig,
    RunSummary,
    config_from_options,
    crash_point,
    finish_run,
    keep_dead_letters,
    locked,
    nothing_to_do,
    plan_run,
    require_outputs,
    run_pipeline,
    skipped_summary,
)
from transforms.shuffler.elements import DEAD, TIMES, VERIFIED, TimePolicy
from transforms.shuffler.graph import PartHeader, ReleasePart, ScaleOut, Shuffle, WindowClock, part_header
from transforms.shuffler.ingress import IngressFn
from transforms.shuffler.publish import publisher_for
from transforms.shuffler.release_files import ReleaseFile, file_digest, iter_batches, part_name, write_release
from transforms.sinks import StageAvroRecords
from transforms.staging import (
    Location,
    StagedEntry,
    StageFn,
    iter_staged_entries,
    join,
    load_staged,
    stable_name,
)
from transforms.state.ledger import WITHHELD, ReleaseEntry, ReleaseKey, ReleaseLedger
from transforms.state.prior_runs import prior_runs
from transforms.state.verified_sets import VerifiedSets

LOG = logging.getLogger(__name__)
STAGE = "shuffle"
PART = "part"  # staging prefix of release parts


def build(pipeline: beam.Pipeline, run: BoundedRun, ledger: ReleaseLedger) -> None:
    config = run.config
    specs = list(config.specs)
    prior = replace(prior_runs(run.state, (e for s in specs for e in ledger.entries(s.spec_id)), run.key),
                    verified=VerifiedSets.load(config.state))
    clock = WindowClock(run.now_ms, config.out_of_orderness_seconds * 1000, config.idle_timeout_seconds * 1000,
                        dict(run.state.max_event_ms), dict(run.state.last_data_wall_ms), config.drain)
    times = TimePolicy(run.now_ms, config.max_age_seconds * 1000, config.max_skew_seconds * 1000)
    registry = str(config.keys / "registry" / "devices.parquet")
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
        specs, shuffler_prf_key(config), clock, subkeys, spill=spill)
    _ = released | "StageParts" >> beam.ParDo(part_stager(staging))
    _ = held | "StageHeld" >> beam.ParDo(StageFn(staging, "held", lambda kv: stable_name(kv[0])))
    _ = run_times | "StageTimes" >> beam.ParDo(StageFn(staging, "time", lambda kv: stable_name(kv[0])))
    _ = ingress[VERIFIED] | "StageVerified" >> beam.ParDo(StageFn(staging, "verified", lambda v: stable_name(
        v[0], v[1][0], len(v[1]))))
    _ = ((ingress[DEAD], dead) | "AllDead" >> beam.Flatten()
         | "StageDeadLetters" >> StageAvroRecords(run.staging, DEAD_LETTERS, "DeadLetter"))


def shuffler_prf_key(config: JobConfig) -> bytes:
    """The shuffler's persisted PRF key (16 bytes for SipHash); a test seed replaces it only when given."""
    from transforms.mechanisms.randomness import job_key_from_seed
    from transforms.trust.keys import load_or_create_secret

    if config.seed is not None:
        return job_key_from_seed(config.seed + 0x5EED)
    return load_or_create_secret(config.keys / "shuffler" / "prf.key")[:16]


def release_file(config: JobConfig, release_id: str) -> Path:
    return config.state / "releases" / f"{release_id}.bin"


def part_stager(staging: Location) -> StageFn:
    """The stage that writes release parts, each with its ``PartHeader`` in the batch's index."""
    return StageFn(staging, PART, part_name, header_of=part_header)


class StagedParts(Sequence[ReleasePart]):
    """The staged parts of one release, in sub-key order: their headers held, each part read from staging
    when accessed and not kept, so the driver holds one part (a sub-crowd) at a time, however large the
    crowd, and reads no part's messages to group, count or withhold a release (``headers``)."""

    def __init__(self, entries: Sequence[StagedEntry], headers: Sequence[PartHeader] | None = None):
        self._entries = list(entries)
        self.headers = list(headers) if headers is not None else [header_of(e) for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> ReleasePart:  # type: ignore[override]
        return self._entries[index].load()

    @property
    def key(self) -> ReleaseKey:
        return release_key(self.headers)

    @property
    def withheld(self) -> bool:
        return is_withheld(self.headers)


def header_of(entry: StagedEntry) -> PartHeader:
    """A staged part's header, from the batch's index; a part staged without one (by an earlier esa) is read."""
    return entry.header if isinstance(entry.header, PartHeader) else part_header(entry.load())


def staged_releases(staging: Location) -> Iterator[StagedParts]:
    """The staged parts, one release at a time (part names start with the release id), sub-key order."""
    headed = ((header_of(e), e) for e in iter_staged_entries(staging, PART))
    for _, group in itertools.groupby(headed, key=lambda he: release_key([he[0]])):
        headers, entries = zip(*group, strict=True)
        yield StagedParts(entries, headers)


def publish(config: JobConfig, release_id: str, path: Path) -> int:
    """Produce a release's batches from its file, keyed ``release_id:index``, in one Kafka transaction under the
    stream's transactional id (``transforms.shuffler.publish``: all batches visible or none; a second shuffler
    on this topic fences this one). Raises unless the transaction committed."""
    publisher = publisher_for(config.bootstrap, config.shuffled_topic, config.kafka_config)
    return publisher.publish((f"{release_id}:{i}".encode(), data) for i, data in enumerate(iter_batches(path)))


def republish_unpublished(config: JobConfig, ledger: ReleaseLedger) -> int:
    """Crash recovery: releases sealed by a run that died before publishing them go out now, identical."""
    done = 0
    for entry in ledger.unpublished():
        path = release_file(config, entry.release_id)
        if file_digest(path) != entry.digest:
            raise RuntimeError(f"staged release {entry.release_id} does not match its ledger digest; refusing "
                               "to publish (state directory damaged?)")
        publish(config, entry.release_id, path)
        ledger.mark_published(entry.key)
        done += 1
    if done:
        LOG.warning("republished %d release(s) sealed by an interrupted run", done)
    return done


def withheld_entry(key: ReleaseKey, source_ends: dict[str, int], run_key: str) -> ReleaseEntry:
    """The ledger entry of a window the crowd threshold withheld: sealed, never published, its reports late."""
    from transforms.trust.release import release_id_of

    return ReleaseEntry(key=key, release_id=release_id_of(key.spec_id, key.crowd_id, key.window_end_ms),
                        digest="withheld", n_sets=0, n_messages=0, batches=0, source_ends=source_ends,
                        run_key=run_key, sealed_at_ms=int(time.time() * 1000), status=WITHHELD)


def release_key(parts: Sequence[PartHeader | ReleasePart]) -> ReleaseKey:
    """The (spec, crowd, window end) of a release, from its parts or their headers."""
    return ReleaseKey(parts[0].spec_id, parts[0].crowd_id, parts[0].window_end_ms)


def is_withheld(parts: Sequence[PartHeader | ReleasePart]) -> bool:
    """Whether the crowd threshold withheld a release (no part has a set), from its parts or their headers."""
    return sum(p.n_sets for p in parts) == 0


def seal_written(config: JobConfig, ledger: ReleaseLedger, written: ReleaseFile, source_ends: dict[str, int],
                 run_key: str) -> bool:
    """One release written to its durable file (not withheld): ledger seal -> publish -> mark published.

    False when the window was already sealed with another digest (by an earlier or a racing run): this
    release is discarded and the sealed one stays, at most one release per window ever.
    """
    key = written.key
    stored = ledger.get(key)
    if stored is not None and stored.digest != written.digest:
        written.discard()  # never overwrite the file of what was released (or withheld) before
        LOG.error("window %s of %s crowd %s was already sealed by run %s; this run's release is discarded",
                  key.window_end_ms, key.spec_id, key.crowd_id, stored.run_key)
        return False
    written.commit()
    entry = ReleaseEntry(key=key, release_id=written.release_id, digest=written.digest, n_sets=written.n_sets,
                         n_messages=written.n_messages, batches=written.batches, source_ends=source_ends,
                         run_key=run_key, sealed_at_ms=int(time.time() * 1000))
    stored, created = ledger.seal(entry)
    if not created and stored.digest != written.digest:
        LOG.error("window %s of %s crowd %s was already released by run %s; this run's release is discarded",
                  key.window_end_ms, key.spec_id, key.crowd_id, stored.run_key)
        return False
    crash_point("shuffle:after_seal")
    if stored.status != "published":
        publish(config, written.release_id, written.path)
        crash_point("shuffle:after_publish")
        ledger.mark_published(key)
    return True


def seal_and_publish(run: BoundedRun, ledger: ReleaseLedger) -> tuple[int, int]:
    """The release step, one staged release at a time (``seal_written``). Withheld windows are sealed
    together at the end (one durable batch). Each part's messages are read by ``write_release`` alone (see
    there how often); grouping and withholding use the parts' staged headers."""
    from transforms.trust.keys import load_shuffler_signer

    config = run.config
    released, conflicts = 0, 0
    withheld: list[ReleaseEntry] = []
    signer: tuple | None = None
    for parts in staged_releases(run.staging):
        if parts.withheld:  # withheld by the crowd threshold: sealed as such, never published
            withheld.append(withheld_entry(parts.key, run.source_ends, run.key))
            continue
        signer = signer or load_shuffler_signer(config.keys)
        written = write_release(config.state / "releases", parts, *signer, headers=parts.headers)
        del parts  # the release is in its file: hold one release's messages at a time, never two
        if seal_written(config, ledger, written, run.source_ends, run.key):
            released += 1
        else:
            conflicts += 1
    # A window another attempt sealed stays as it was sealed; this attempt's "withheld" is then not recorded.
    ledger.seal_many(withheld)
    return released, conflicts


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    """One bounded run of the shuffler (see the module doc); ``--kafka_io sdf``: the streaming shuffler
    (``pipelines.stream_shuffle``), which runs until its source stops."""
    if config.kafka_io == "sdf":
        from pipelines import stream_shuffle

        return stream_shuffle.run(config, options)
    started = time.perf_counter()
    with locked(config, STAGE):
        ledger = ReleaseLedger(config.state / "ledger")
        if not config.reports_topic:
            raise JobUsageError("the shuffle job needs --reports_topic")
        require_outputs(config, STAGE, [config.shuffled_topic])  # before anything is sealed or republished
        republish_unpublished(config, ledger)
        bounded = plan_run(config, STAGE, config.reports_topic, options)
        if nothing_to_do(bounded, windowed=True):
            return skipped_summary(bounded, started)
        crash_point("shuffle:before_pipeline")
        counters = run_pipeline(lambda p: build(p, bounded, ledger), options)
        crash_point("shuffle:after_pipeline")
        releases, conflicts = seal_and_publish(bounded, ledger)
        keep_dead_letters(bounded, config.state / "dead_letters")
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
                      {"releases": releases, "conflicts": conflicts, "run_key": bounded.key,
                       "progress": bounded.observed})


def run_from_argv(argv: Sequence[str]) -> RunSummary:
    """``esa shuffle --spec X.toml --kafka_bootstrap H:P --reports_topic R --shuffled_topic S ...``"""
    options = PipelineOptions(list(argv))
    return run(config_from_options(options), options)
