"""What every esa job shares: its config, its state directory, the bounded read, the run, the accounting.

A job is a service that runs as a sequence of bounded runs. Each run, under an exclusive lock on the job's
``--state_dir``, reads every partition from its *resume offset* (kept in the state dir; the consumer
group's committed offset only on the very first run) to the end of the log, runs one Beam pipeline that
stages its results in ``state_dir/staging/<run key>.<attempt>`` (or under ``--staging_location``, a URL the workers of a
cluster can write: ``gs://``, ``s3://``), and then -- only after the pipeline succeeded --
the job's driver seals each release in the ledger, publishes it, moves the staged outputs into place and
finally saves the new resume offsets (never past a record of a window that is still open) and commits
them to the consumer group for lag monitoring. A crash anywhere before the state is saved re-runs with
the same run key: staged outputs are redone (each attempt in its own directory, so a job an earlier
attempt left running on a cluster never writes into them), sealed releases republished identically.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines.exit_codes import ConfigError, KafkaUnavailableError
from pipelines.flink_jobs import adopt_flink_job, owned_flink_job
from pipelines.job_config import GroupInUse, JobConfig, RunSummary
from pipelines.options import (
    local_runner_requested,
)
from pipelines.preflight import domain_dead_letter_topic, existing_topics, publishable, require_topics
from schemas import encode_record
from transforms.io.kafka.bounded import (
    PartitionRange,
    ReadFromKafkaBounded,
    commit_plan,
    committed_offsets,
    ensure_topics,
    open_transactions,
    plan_bounded_read,
    produce_records,
)
from transforms.io.kafka.topic_policy import check_topics
from transforms.io.sinks import avro_bytes, load_staged_avro
from transforms.io.staging import clear_staging, join, prepare_staging
from transforms.runtime.beam_memo import memoize_beam_inspection
from transforms.runtime.faults import crash_point
from transforms.state.dead_letters import ReasonCounts, write_counts
from transforms.state.files import StateLock, atomic_write_bytes, create_exclusive
from transforms.state.run_state import RunState, run_key

LOG = logging.getLogger(__name__)
DEAD_LETTERS = "dead_letters"  # the staged dead letters' file prefix (``transforms.io.sinks.StageAvroRecords``)


@dataclass
class BoundedRun:
    """One run of a job: its plan, its run key, its staging directory and its prior state."""
    config: JobConfig
    stage: str
    topic: str
    state: RunState
    plan: list[PartitionRange]
    key: str
    staging: str  # a local directory or a URL (``s3://...``, ``gs://...``)
    now_ms: int
    # What the operator's progress line and metrics report of this run (dead letters by reason class,
    # watermark, consumer lag), filled as the run goes (``keep_dead_letters``, ``finish_run``).
    observed: dict[str, Any] = field(default_factory=dict)

    @property
    def source_ends(self) -> dict[str, int]:
        return {f"{r.topic}/{r.partition}": r.stop for r in self.plan}

    def reader(self) -> beam.PTransform:
        c = self.config
        if c.kafka_io == "xlang":
            return xlang_reader(self)
        return ReadFromKafkaBounded(c.bootstrap, self.topic, c.group_id, batched=True, plan=self.plan,
                                    consumer_config=c.kafka_config, client=c.kafka_client)


def xlang_reader(run: BoundedRun) -> beam.PTransform:
    """``--kafka_io xlang``: the plan read by Java's KafkaIO (``transforms.io.kafka.xlang``). Java starts at the
    group's committed offsets, so each range's start is committed first (what the last run committed, unless
    that commit failed), and the plan's committed records are counted for the read's bound and its check."""
    from pipelines.artifacts import ArtifactUnavailableError
    from pipelines.kafka_expansion import shared_expansion_service
    from transforms.io.kafka.xlang import ReadFromKafkaXlang, count_plan

    c = run.config
    try:
        endpoint = shared_expansion_service().endpoint
    except (ArtifactUnavailableError, RuntimeError) as err:
        raise ConfigError(f"--kafka_io xlang: {err} (see docs/deployment.md)") from None
    commit_plan(c.bootstrap, c.group_id, [r._replace(stop=r.start) for r in run.plan], c.kafka_config,
                client=c.kafka_client)
    counts = count_plan(c.bootstrap, run.plan, c.kafka_config, client=c.kafka_client)
    return ReadFromKafkaXlang(c.bootstrap, run.topic, c.group_id, run.plan, counts, endpoint)


def staging_root(config: JobConfig, stage: str) -> str:
    """Where this job's runs stage: ``STATE/staging``, or ``LOCATION/esa-<stage>-<id>`` for a shared location.

    The id is drawn once per state directory and kept in it, so two jobs (or two deployments) staging under
    the same location never see each other's files: everything under the root belongs to the job that holds
    the state directory's lock, which may therefore clear it.
    """
    if not config.staging_location:
        return str(config.state_layout.staging)
    id_path = config.state_layout.staging_id
    create_exclusive(id_path, secrets.token_hex(8).encode())  # no-op when it exists
    staging_id = id_path.read_text().strip()
    return join(config.staging_location, f"esa-{stage}-{staging_id}")


def use_filesystem_options(options: PipelineOptions | None) -> None:
    """Let the driver's own ``FileSystems`` calls use the job's options (object store endpoint, credentials)."""
    FileSystems.set_options(options if options is not None else PipelineOptions([]))


def plan_run(config: JobConfig, stage: str, topic: str, options: PipelineOptions | None = None) -> BoundedRun:
    """Read the job's state and plan this run: resume offsets -> end of log, and a stable run key."""
    config = config.with_group(stage)  # a config built in code without a group: the stage's default
    state_path = config.state_layout.run_state
    state = RunState.load(state_path)
    # A typo'd topic is an error naming the closest one, never created; asked with the job's client and settings.
    require_topics(config.bootstrap, [topic], client=config.kafka_client, kafka_config=config.kafka_config)
    check_topics(config.bootstrap, [topic], config.kafka_config)  # compacted or short-lived: refused, exit 4
    resume = {int(k.rsplit("/", 1)[1]): v for k, v in state.resume.items() if k.rsplit("/", 1)[0] == topic}
    if not resume and not config.adopt_group:
        owned = committed_offsets(config.bootstrap, config.group_id, topic, config.kafka_config,
                                  client=config.kafka_client)
        if owned:
            raise GroupInUse(
                f"consumer group {config.group_id!r} has committed offsets on {topic!r} ({owned}) but the state "
                f"directory {config.state} has never run {stage}: another esa job may own this group. Use that "
                "job's --state_dir, another --consumer_group, or --adopt_consumer_group to start from the "
                "group's offsets")
    plan = plan_bounded_read(config.bootstrap, topic, config.group_id, consumer_config=config.kafka_config,
                             client=config.kafka_client,
                             start_offsets=resume or None)
    starts = {f"{r.topic}/{r.partition}": r.start for r in plan}
    key = run_key(starts, state.processed_until)
    now = config.now_ms if config.now_ms is not None else int(time.time() * 1000)
    pending = open_transactions(config.bootstrap, plan, config.kafka_config, client=config.kafka_client)
    if pending:  # an open transaction may still add records: the partition is active, its watermark waits
        LOG.info("%s: partition(s) %s hold records of an open transaction (not read before it commits); they "
                 "count as active, so the watermark does not pass what it may still add", topic, pending)
        state = replace(state, last_data_wall_ms={**state.last_data_wall_ms,
                                                  **{f"{topic}/{p}": now for p in pending}})
    use_filesystem_options(options)
    adopt_flink_job(config, stage, options)  # on a Flink cluster: an earlier driver's orphaned job is cancelled
    root = staging_root(config, stage)
    clear_staging(root)  # crashed attempts (same key or older): their staged files are redone or stale
    # Each attempt stages in its own directory: a job an earlier attempt left running on a cluster (its driver
    # killed) can only write where nothing reads, never into this attempt's files (pipelines.flink_jobs).
    staging = join(root, f"{key}.{secrets.token_hex(4)}")
    prepare_staging(staging)
    fresh = sum(max(0, r.stop - max(r.start, state.processed_until.get(f"{r.topic}/{r.partition}", 0))) for r in plan)
    LOG.log(logging.INFO if fresh else logging.DEBUG, "%s run %s: %d records planned from %s, %d of them new "
            "(resume %s)", stage, key, sum(r.stop - r.start for r in plan), topic, fresh,
            {r.partition: r.start for r in plan})
    bounded = BoundedRun(config, stage, topic, state, plan, key, staging, now)
    bounded.observed["new_records"] = fresh  # read for the first time: what esa_records_read_total counts
    return bounded


def nothing_to_do(run: BoundedRun, windowed: bool) -> bool:
    """True when this run can be skipped: no record past what earlier runs processed and, for a job that holds
    windows (``windowed``), no window end plus allowed lateness that the watermark crossed since the last run.

    Why: a ``--follow`` job otherwise re-reads every held set each poll, to find that no window closed. The
    check needs no index of the held windows: windows end at multiples of the spec's size, so a held window
    can only have closed if some multiple ``e`` has ``previous < e + lateness <= now``. The previous watermark
    is computed at the latest wall time a run saw data, never later than the last run: an underestimate, so a
    run is sometimes done for nothing but never skipped when one may be due. ``--drain`` always runs.
    """
    c, state = run.config, run.state
    if (windowed and c.drain) or any(r.stop > state.processed_until.get(f"{r.topic}/{r.partition}", 0)
                                     for r in run.plan):
        return False
    if not windowed:  # what it holds (batches waiting for the rest of their release, or for their shuffler
        return all(r.start >= r.stop for r in run.plan)  # key to be distributed) is retried every run
    ooo, idle = c.out_of_orderness_seconds * 1000, c.idle_timeout_seconds * 1000
    before = state.watermark_ms(max(state.last_data_wall_ms.values(), default=0), ooo, idle)
    now = state.watermark_ms(run.now_ms, ooo, idle)
    if before is None or now is None:
        return now is None  # no data ever: nothing is held
    for spec in c.specs:
        size, lateness = spec.window_seconds * 1000, spec.allowed_lateness_seconds * 1000
        if (now - lateness) // size > (before - lateness) // size:
            return False
    return True


def skipped_summary(run: BoundedRun, started: float) -> RunSummary:
    """The summary of a run ``nothing_to_do`` skipped: nothing read, the state untouched."""
    run.observed.update(consumer_lag=sum(r.stop - r.start for r in run.plan), now_ms=run.now_ms, dead_by_reason={})
    return RunSummary({}, run.config.out_dir, time.perf_counter() - started, run.stage, {},
                      {"run_key": run.key, "skipped": True, "progress": run.observed},
                      dead_letters_dir=run.config.state_layout.dead_letters)


def finish_run(run: BoundedRun, held: dict[str, int], run_max_event_ms: dict[str, int]) -> RunState:
    """Save where the next run resumes (never past a held record) and commit it to the consumer group."""
    state = run.state
    resume = dict(state.resume)
    processed = dict(state.processed_until)
    max_event = dict(state.max_event_ms)
    last_wall = dict(state.last_data_wall_ms)
    for r in run.plan:
        pkey = f"{r.topic}/{r.partition}"
        resume[pkey] = min(held.get(pkey, r.stop), r.stop)
        processed[pkey] = max(processed.get(pkey, 0), r.stop)
    for pkey, event_ms in run_max_event_ms.items():
        max_event[pkey] = max(max_event.get(pkey, event_ms), event_ms)
        last_wall[pkey] = run.now_ms
    clocks = {}
    for r in run.plan:
        pkey = f"{r.topic}/{r.partition}"
        entries = [e for e in state.read_clock.get(pkey, []) if e[0] > resume[pkey]]  # still re-readable
        if r.stop > max((e[0] for e in entries), default=0):
            entries.append([r.stop, run.now_ms])
        if entries:
            clocks[pkey] = entries
    new = RunState(resume=resume, processed_until=processed, max_event_ms=max_event, last_data_wall_ms=last_wall,
                   runs=state.runs + 1, updated_at_ms=int(time.time() * 1000), read_clock=clocks)
    c = run.config
    run.observed.update(
        watermark_ms=None if c.drain else new.watermark_ms(run.now_ms, c.out_of_orderness_seconds * 1000,
                                                           c.idle_timeout_seconds * 1000),
        # What the group is behind the log end this run saw: records held for windows that are still open.
        consumer_lag=sum(r.stop - resume[f"{r.topic}/{r.partition}"] for r in run.plan),
        now_ms=run.now_ms)
    crash_point(f"{run.stage}:before_state")
    new.save(run.config.state_layout.run_state)
    commit = [PartitionRange(r.topic, r.partition, r.start, resume[f"{r.topic}/{r.partition}"]) for r in run.plan]
    try:
        commit_plan(run.config.bootstrap, run.config.group_id, commit, run.config.kafka_config,
                    client=run.config.kafka_client)
    except Exception as err:
        LOG.warning("could not commit offsets to group %s (state is saved): %s", run.config.group_id, err)
    try:
        clear_staging(run.staging)
    except Exception as err:  # the run has committed; the next run clears its staging root anyway
        LOG.warning("could not delete the staged files of run %s under %s: %s", run.key, run.staging, err)
    return new


def run_pipeline(build: Callable[[beam.Pipeline], None], options: PipelineOptions | None) -> dict[str, int]:
    """Build with ``build``, run to completion on the FnApiRunner (or the runner the options name).

    Beam 2.62's portable runners (Flink, Prism, a job endpoint) set ``--runner`` to None on the options object
    they are given (newer Beams pass them a copy); it is put back, or the next pipeline of this process
    (``esa run``'s shuffle and analyze, the next run of ``--follow``) would silently run in process."""
    options = options or PipelineOptions([])
    memoize_beam_inspection()  # Beam's DoFn and options inspection once per object: a fixed cost of every run
    named = options.view_as(StandardOptions).runner
    runner = FnApiRunner() if local_runner_requested(options) else None
    pipeline = beam.Pipeline(runner=runner, options=options)
    build(pipeline)
    with owned_flink_job(options):  # on a Flink cluster: a lost job server is exit 10, its job cancelled
        try:
            result = pipeline.run()
        finally:
            options.view_as(StandardOptions).runner = named
        state = result.wait_until_finish()
    if str(state) not in {"DONE", "PipelineState.DONE"}:
        raise RuntimeError(f"pipeline ended in state {state}; nothing was released or committed")
    return esa_counters(result)


# State directories this process holds for its whole life (``hold_state_dirs``): a ``--follow`` service
# keeps its lock between runs, so a second copy of the job is refused at start, not let in between runs.
_HELD_FOR_LIFE: dict[Path, StateLock] = {}


def locked(config: JobConfig, stage: str) -> AbstractContextManager[object]:
    """The state directory's lock for one run; nothing to take when this process holds it for life."""
    config.state.mkdir(parents=True, exist_ok=True)
    if config.state.resolve() in _HELD_FOR_LIFE:
        return nullcontext()
    return StateLock(config.state, stage)


@contextmanager
def hold_state_dirs(state_dirs: Sequence[Path], purpose: str) -> Iterator[None]:
    """Lock every directory in ``state_dirs`` until the block ends (StateLocked if another process holds one)."""
    with ExitStack() as stack:
        held = []
        for directory in state_dirs:
            lock = stack.enter_context(StateLock(directory, purpose))
            key = Path(directory).resolve()
            _HELD_FOR_LIFE[key] = lock
            held.append(key)
        try:
            yield
        finally:
            for key in held:
                _HELD_FOR_LIFE.pop(key, None)


def esa_counters(result: Any) -> dict[str, int]:
    """Sum the ``esa`` namespace counters over steps (the same counter name is used by several stages)."""
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace("esa"))["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value)
    return totals


def keep_dead_letters(run: BoundedRun, directory: Path) -> Path | None:
    """Move the run's staged dead letters to their per-run file in the stage's own domain, count them by
    stage and reason class (``dead_letter_counts/``: what may be shown outside the domain), and publish them
    to ``--dead_letter_topic`` if one is configured. Named by the run key, so a rerun replaces a crashed
    attempt's file and a later run adds a new one."""
    letters = load_staged_avro(run.staging, DEAD_LETTERS)
    if not letters:
        run.observed["dead_by_reason"] = {}
        return None
    target = directory / f"dead-letters-{run.key}.avro"
    atomic_write_bytes(target, avro_bytes("DeadLetter", letters, run.key.encode()))
    counts = ReasonCounts().add_letters(letters)
    write_counts(directory / "counts", run.key, counts)
    by_reason: dict[str, int] = {}
    for row in counts.to_rows():  # reason classes carry no identifiers: safe for logs and metrics
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + row["count"]
    run.observed["dead_by_reason"] = by_reason
    config = run.config
    topic = domain_dead_letter_topic(config.dead_letter_topic, run.stage)
    if topic:
        records = (encode_record("DeadLetter", letter, check=False) for letter in publishable(run.stage, letters))
        produce_records(config.bootstrap, topic, records, producer_config=config.kafka_config,
                        client=config.kafka_client)
    return target


def require_outputs(config: JobConfig, stage: str, topics: Sequence[str | None]) -> None:
    """The topics ``stage`` writes (and its domain's dead-letter topic) exist before anything is sealed or
    published: a typo such as ``--shuffled_topic shufled`` would otherwise be auto-created by the first write
    and the ledger would say "published" to a topic no reader knows. ``--create_topics`` creates them."""
    wanted = [t for t in dict.fromkeys([*topics, domain_dead_letter_topic(config.dead_letter_topic, stage)]) if t]
    if not wanted:
        return
    if config.create_topics:
        # Only the missing ones: a principal with ACLs may write a topic but not create it (CreateTopics is
        # refused for an existing topic too), and a deployment creates its topics beforehand.
        have = existing_topics(config.bootstrap, client=config.kafka_client, kafka_config=config.kafka_config)
        missing = [t for t in wanted if t not in have]
        if missing:
            try:
                ensure_topics(config.bootstrap, missing, partitions=3, client_config=config.kafka_config,
                              client=config.kafka_client)
            except RuntimeError as err:
                raise KafkaUnavailableError(f"--create_topics: cannot create {', '.join(missing)} on "
                                            f"{config.bootstrap}: {err}") from None
    else:
        require_topics(config.bootstrap, wanted, client=config.kafka_client, kafka_config=config.kafka_config)
    check_topics(config.bootstrap, wanted, config.kafka_config)  # before anything is sealed or published
