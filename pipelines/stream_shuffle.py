"""The streaming shuffler (``esa shuffle --kafka_io sdf``): one unbounded pipeline, windows closed by the
runner's watermark, each release sealed and published by the driver's release agent while it runs.

The pipeline (on the workers): the unbounded source (``transforms.io.kafka.unbounded``: commit on finalize, a per-
partition watermark believing only authenticated event times) -> ``IngressFn`` (unchanged; its device registry
reloaded when re-enrolled) -> each set in its crowd's event-time window
(``transforms.shuffler.streaming.crowd_window``, a standard ``FixedWindows``: on time at window end + allowed
lateness, as the bounded ``WindowClock``) -> late panes dead-lettered -> the unchanged ``Shuffle`` (dedupe,
threshold, delete, permute) with every fired window treated as closed -> release parts staged, then each release's
completion marker. The driver (this module): holds the state lock, starts the pipeline without blocking (a thread
around the local runner; ``PortableRunner.run`` is asynchronous anyway), and runs the release agent
(``transforms.shuffler.release_agent``) until the pipeline ends or SIGINT/SIGTERM asks it to: then it writes the
stop file, which finishes the source, so the runner fires every open window (a drain), and the agent releases what
was staged before it exits.

Semantics, and how they differ from the bounded runs: offsets are committed when the runner finalizes a
bundle, so windows still open live in the runner's state (Flink/Dataflow checkpoints and snapshots). A job
restarted *with* its snapshot (Flink savepoint, Dataflow ``--update``) loses nothing; restarted without it,
the reports of windows open at that moment are lost -- never released twice: the ledger knows every window
released, and ingress dead-letters what arrives for it as late.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, PortableOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines import stream_accounting
from pipelines.exit_codes import JobUsageError
from pipelines.flink_jobs import job_server_lost, one_line, quiet_message_thread
from pipelines.job import esa_counters, locked, require_outputs, use_filesystem_options
from pipelines.job_config import GroupInUse, JobConfig, RunSummary
from pipelines.metrics import JobMetrics
from pipelines.options import finish_bundles_before_checkpoints, local_runner_requested
from pipelines.preflight import require_topics
from pipelines.registry import STREAM_CATCH_UP_S, catch_up_job, store_path
from pipelines.runners import runner_name
from pipelines.service import StopRequest
from pipelines.stream_orphan import JobServerLostError, finish_lost_drain, keep_lost_job, resume_orphan, stream_root
from pipelines.targets import release_target
from transforms.io.kafka.bounded import committed_offsets, consumer_lag
from transforms.io.kafka.topic_policy import check_topics
from transforms.io.kafka.unbounded import ReadFromKafkaUnbounded, SourceClock, wall_ms
from transforms.io.staging import is_url, join, write_staged
from transforms.shuffler.release_agent import AgentTotals, ReleaseAgent, progress
from transforms.shuffler.release_step import STAGE, republish_unpublished, shuffler_prf_key
from transforms.shuffler.streaming import STOP_FILE, SetEventTimes, StreamShuffle, WallClockTimePolicy
from transforms.state.files import create_exclusive, read_json
from transforms.state.ledger import ReleaseLedger
from transforms.state.prior_runs import prior_runs
from transforms.state.run_state import RunState
from transforms.state.verified_sets import VerifiedSets

LOG = logging.getLogger("esa.stream_shuffle")
AGENT_POLL_SECONDS = 0.5  # between two looks at a local staging directory
AGENT_POLL_SECONDS_URL = 5.0  # ... at an object store (each look is a listing request)
PROGRESS_SECONDS = 10.0
DRAIN_RETRY_S = 5.0  # between two looks at a drain the job may have refused
METRICS_SECONDS = 2.0  # between two updates of the metrics endpoint (each asks the broker for offsets)
GROUP_FILE = "stream_group.json"


def build(pipeline: beam.Pipeline, config: JobConfig, ledger: ReleaseLedger, root: str, run_key: str) -> None:
    """The streaming shuffle graph (see the module doc)."""
    specs = list(config.specs)
    state = RunState.load(config.state_layout.run_state)
    prior = replace(prior_runs(state, (e for s in specs for e in ledger.entries(s.spec_id)), run_key),
                    verified=VerifiedSets.load(config.state))
    now = wall_ms()
    max_age_ms, max_skew_ms = config.max_age_seconds * 1000, config.max_skew_seconds * 1000
    registry = str(store_path(config.state))  # caught up by run() and _serve (pipelines.registry)
    stop_ms = None if config.stop_after_idle_seconds is None else int(config.stop_after_idle_seconds * 1000)
    source = ReadFromKafkaUnbounded(
        config.bootstrap, str(config.reports_topic), config.group_id, consumer_config=config.kafka_config,
        client=config.kafka_client, event_times=SetEventTimes(specs, registry, max_age_ms, max_skew_ms,
                                                                   keys_dir=str(config.keys)),
        clock=SourceClock(config.out_of_orderness_seconds * 1000, config.idle_timeout_seconds * 1000, stop_ms),
        batched=True, stop_path=join(root, STOP_FILE))
    _ = (pipeline | "ReadReports" >> source
         | "StreamShuffle" >> StreamShuffle(specs, registry, prior, WallClockTimePolicy(now, max_age_ms, max_skew_ms),
                                           shuffler_prf_key(config.keys, config.seed), root, config.max_age_seconds,
                                           config.crypto_threads, config.python_gc, keys_dir=str(config.keys),
                                           join_in_state=runner_name(pipeline.options) == "FlinkRunner"))


class PipelineThread:
    """Runs a pipeline to its end on a thread, so the driver's release agent works meanwhile."""
    def __init__(self, build_fn: Callable[[beam.Pipeline], None], options: PipelineOptions | None):
        options = options or PipelineOptions([])
        from pipelines.flink_drain import flink_rest

        self._flink_rest = flink_rest(options)  # read before Beam's runner touches the options
        self._endpoint = options.view_as(PortableOptions).job_endpoint
        self._job_name = str(options.view_as(GoogleCloudOptions).job_name or "")
        if self._flink_rest:
            quiet_message_thread()  # Beam's message thread's traceback when the job server dies: logged, not printed
        self._flink_jid: str | None = None
        self._looked_for_jid = 0.0
        self._drain: tuple[str, str] | None = None  # the Flink job id and the request of the drain asked
        self.drain_requested = False  # a drain was asked (the stop file written), answered or not
        self._drain_asked = 0.0
        runner = FnApiRunner() if local_runner_requested(options) else None
        if runner_name(options) == "FlinkRunner":
            finish_bundles_before_checkpoints(options)
        self._pipeline = beam.Pipeline(runner=runner, options=options)
        build_fn(self._pipeline)
        self._result: Any = None
        self._state: Any = None
        self._error: BaseException | None = None
        if runner is None:
            # A portable runner (Prism, Flink, a job endpoint) submits and returns; it may start its job server
            # first, which installs a SIGINT handler and so must run on the main thread. Only the wait is threaded.
            self._result = self._pipeline.run()
        self._thread = threading.Thread(target=self._run, name="esa-stream-pipeline", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._result is None:
                self._result = self._pipeline.run()
            self._state = self._result.wait_until_finish()
        except BaseException as err:  # handed to the driver's thread in counters()
            self._error = err

    def running(self) -> bool:
        return self._thread.is_alive()

    def drain(self) -> None:
        """On a Flink cluster, ask Flink to drain the job (``pipelines.flink_drain``): there, the end of the read
        alone does not end the job. Other runners end it by themselves once the source finishes. Called again
        while the job runs (``drain_again``): a drain the job refused is asked again."""
        from pipelines.flink_drain import drain

        if self._flink_rest is None:
            return
        job_id = self._beam_job_id()
        if not job_id:
            LOG.warning("no Beam job id to drain on %s (stop the job by hand: flink stop --drain)", self._flink_rest)
            return
        self._drain_asked = time.monotonic()
        self.drain_requested = True
        self._drain = drain(self._flink_rest, job_id)

    def drain_again(self) -> None:
        """A drain asked earlier and refused (the job's tasks were not all running: measured when SIGTERM came
        while a resumed job was still restoring), or not asked because the job was not found: ask again, at
        most every ``DRAIN_RETRY_S``."""
        from pipelines.flink_drain import drain_failure

        if self._flink_rest is None or time.monotonic() - self._drain_asked < DRAIN_RETRY_S:
            return
        if self._drain is not None:
            failure = drain_failure(self._flink_rest, *self._drain)
            if failure is None:
                self._drain_asked = time.monotonic()  # running, or done: the job ends by itself
                return
            LOG.warning("Flink refused the drain of job %s (%s): asking again", self._drain[0], failure)
        self.drain()

    def _beam_job_id(self) -> str | None:
        job_id = getattr(self._result, "_job_id", None) or getattr(self._result, "job_id", None)
        return str(job_id) if job_id else None

    def find_flink_job(self) -> str | None:
        """The Flink job's id, looked up (at most every 5 s) while it runs, kept for after it ended."""
        from pipelines.flink_drain import flink_job_id

        beam_id = self._beam_job_id()
        if self._flink_rest and beam_id and self._flink_jid is None and time.monotonic() - self._looked_for_jid > 5:
            self._looked_for_jid = time.monotonic()
            try:
                self._flink_jid = flink_job_id(self._flink_rest, beam_id)
            except Exception as err:  # looked for again later
                LOG.debug("Flink job of %s not found yet: %s", beam_id, err)
        return self._flink_jid

    def suspend(self, mark: Callable[[str | None], None]) -> str | None:
        """Stop the Flink job with a savepoint, no drain (open windows stay in it): its location, or None
        where there is no cluster job to suspend. ``mark`` records the job asked to stop before it is asked (and
        None if the stop failed), so a driver killed while it waits leaves the next run able to find the
        savepoint (``pipelines.stream_orphan``)."""
        from pipelines.flink_drain import stop_with_savepoint

        self._looked_for_jid = 0.0
        jid = self.find_flink_job()
        if self._flink_rest is None or jid is None:
            LOG.warning("a suspend (SIGUSR1) needs a job on a Flink cluster: ignored")
            return None
        mark(jid)
        try:
            return stop_with_savepoint(self._flink_rest, jid)
        except Exception as err:  # the job goes on: the operator can signal again, or drain
            mark(None)
            LOG.error("could not suspend job %s into a savepoint; it keeps running: %s", jid, err)
            return None

    def counters_complete(self) -> bool:
        """Whether the runner's counters cover the whole job: not after a Flink failover or restore."""
        from pipelines.flink_drain import restarted

        if self._flink_rest is None:
            return True
        jid = self._flink_jid
        return jid is not None and not restarted(self._flink_rest, jid)

    def cancel(self) -> None:
        """Cancel a submitted job (a cluster's; the local runner's thread ends with this process)."""
        if self._result is None or not self._thread.is_alive():
            return
        try:
            self._result.cancel()
        except Exception as err:  # not every runner can cancel; the operator's runner UI can
            LOG.warning("could not cancel the streaming pipeline: %s", err)

    def counters(self) -> dict[str, int]:
        """The runner's counters once the job ended; JobServerLostError if the wait failed because the job
        server went away while the cluster's job may well run on (``pipelines.stream_orphan.keep_lost_job``)."""
        self._thread.join()
        if self._error is not None and self._flink_rest and job_server_lost(self._error, self._endpoint):
            raise JobServerLostError(self._flink_rest, self._job_name, self._flink_jid, self._endpoint,
                                     one_line(self._error))
        if self._error is not None:
            raise RuntimeError(f"the streaming pipeline failed: {self._error}") from self._error
        if str(self._state) not in {"DONE", "PipelineState.DONE"}:
            raise RuntimeError(f"the streaming pipeline ended in state {self._state}")
        return esa_counters(self._result)


def claim_group(config: JobConfig) -> None:
    """A fresh state directory refuses a consumer group that another job has committed for (as bounded runs
    do), unless ``--adopt_consumer_group``; once claimed (``stream_group.json``) the group is this job's."""
    path = config.state / GROUP_FILE
    claim = {"group": config.group_id, "topic": config.reports_topic}
    if path.exists():
        if read_json(path) != claim:
            raise GroupInUse(f"state directory {config.state} streams {read_json(path)}, not {claim}: use another "
                             "--state_dir per group and topic")
        return
    state = RunState.load(config.state_layout.run_state)
    ran_bounded = any(k.rsplit("/", 1)[0] == config.reports_topic for k in state.resume)
    owned = committed_offsets(config.bootstrap, config.group_id, str(config.reports_topic), config.kafka_config,
                              client=config.kafka_client)
    if owned and not ran_bounded and not config.adopt_group:
        raise GroupInUse(f"consumer group {config.group_id!r} has committed offsets on {config.reports_topic!r} "
                         f"({owned}) but the state directory {config.state} has never run {STAGE}: use that job's "
                         "--state_dir, another --consumer_group, or --adopt_consumer_group")
    import json

    create_exclusive(path, json.dumps(claim, sort_keys=True).encode())


def remove_stop_file(root: str) -> None:
    path = join(root, STOP_FILE)
    if not is_url(path):
        Path(path).unlink(missing_ok=True)
    elif FileSystems.exists(path):
        FileSystems.delete([path])


@contextlib.contextmanager
def stop_request() -> Iterator[Any]:
    """SIGINT/SIGTERM -> a graceful stop (``pipelines.service.StopRequest``); signals can only be caught on the
    main thread, so elsewhere (a driver embedded in another program) the pipeline's own end is the stop."""
    if threading.current_thread() is threading.main_thread():
        with StopRequest() as stop:
            yield stop
    else:
        yield types.SimpleNamespace(requested=False)


def _observe(metrics: JobMetrics | None, agent: ReleaseAgent, config: JobConfig) -> None:
    """Fold the agent's totals and the group's offsets into the metrics endpoint (never stops the agent)."""
    if metrics is None:
        return
    try:
        committed, lag = consumer_lag(config.bootstrap, config.group_id, str(config.reports_topic),
                                      config.kafka_config, client=config.kafka_client)
    except Exception as err:  # metrics only: a broker hiccup is the next update's problem
        LOG.debug("consumer lag unavailable: %s", err)
        committed, lag = -1, None
    metrics.observe_stream(STAGE, agent.totals, committed, lag)


def committed_total(config: JobConfig) -> int:
    """Records the source has committed for the group so far (summed over partitions): the progress measure
    a streaming job has without asking its runner."""
    try:
        found = committed_offsets(config.bootstrap, config.group_id, str(config.reports_topic), config.kafka_config,
                                  client=config.kafka_client)
    except Exception as err:  # progress only: never stop the agent for it
        LOG.debug("committed offsets unavailable: %s", err)
        return -1
    return sum(found.values())


def _catch_up(config: JobConfig) -> None:
    """The device store caught up while the stream runs; a broker hiccup is the next catch-up's problem."""
    try:
        catch_up_job(config)
    except Exception as err:
        LOG.warning("device registry catch-up failed (retried in %.0f s): %s", STREAM_CATCH_UP_S, err)


def _serve(pipeline: PipelineThread, agent: ReleaseAgent, root: str, config: JobConfig, started: float,
           start_committed: int, metrics: JobMetrics | None = None) -> tuple[dict[str, int], str | None]:
    """The release agent's loop, until the pipeline ends; SIGINT/SIGTERM write the stop file (a drain), SIGUSR1
    suspends the job into a savepoint. The counters and the savepoint, if suspended."""
    last_log = last_metrics = last_registry = time.monotonic()
    savepoint: str | None = None
    with stop_request() as stop, stream_accounting.suspend_request() as suspend:
        stopping = False
        while pipeline.running():
            agent.step()
            pipeline.find_flink_job()
            if suspend[0] and not stopping:
                suspend[0] = False
                savepoint = pipeline.suspend(lambda jid: stream_accounting.mark_stopping(config.state, jid))
                stopping = savepoint is not None
            if stopping and savepoint is None:
                pipeline.drain_again()
            if stop.requested and not stopping:
                stopping = True
                if metrics is not None:
                    metrics.set_status("stopping")
                LOG.warning("stopping: the source finishes, every open window fires, then the agent drains")
                write_staged(join(root, STOP_FILE), b"stop\n")
                pipeline.drain()
            if time.monotonic() - last_metrics >= METRICS_SECONDS:
                last_metrics = time.monotonic()
                _observe(metrics, agent, config)
            if time.monotonic() - last_registry >= STREAM_CATCH_UP_S:
                last_registry = time.monotonic()
                _catch_up(config)
            if time.monotonic() - last_log >= PROGRESS_SECONDS:
                last_log = time.monotonic()
                LOG.info("%s", progress(agent.totals, committed_total(config), start_committed,
                                        time.perf_counter() - started))
            time.sleep(AGENT_POLL_SECONDS_URL if is_url(root) else AGENT_POLL_SECONDS)
        counters = pipeline.counters()
        agent.step()  # the windows the end of the source fired
    return counters, savepoint


def run(config: JobConfig, options: PipelineOptions | None = None) -> RunSummary:
    """The streaming shuffler, until its source ends (``--stop_after_idle_seconds``) or a signal stops it."""
    started = time.perf_counter()
    if not config.reports_topic:
        raise JobUsageError("the shuffle job needs --reports_topic")
    with locked(config, STAGE):
        ledger = ReleaseLedger(config.state_layout.ledger)
        require_topics(config.bootstrap, [config.reports_topic], client=config.kafka_client,
                       kafka_config=config.kafka_config)
        check_topics(config.bootstrap, [config.reports_topic], config.kafka_config)  # never a compacted input
        require_outputs(config, STAGE, [config.shuffled_topic])  # before anything is sealed or republished
        target = release_target(config)
        republish_unpublished(target, ledger)
        claim_group(config)
        # names the Flink job; a dead driver's job still running is stopped into a savepoint, resumed from here
        savepoint = resume_orphan(config, ledger, options) or stream_accounting.savepoint_path(options)
        run_key = f"stream-{secrets.token_hex(6)}"
        lineage = stream_accounting.begin(config, savepoint, run_key)  # where the source starts, for the accounting
        catch_up_job(config)  # before any worker verifies a set (pipelines.registry)
        use_filesystem_options(options)
        root = stream_root(config)
        if not is_url(root):
            Path(root).mkdir(parents=True, exist_ok=True)
        remove_stop_file(root)
        agent = ReleaseAgent(target, config.specs, ledger, root, run_key)
        agent.step()  # what a previous driver left staged: a killed driver's job staged it for this lineage
        if savepoint is None:  # ... a new lineage's source starts after it: the abandoned lineage's part
            agent.totals = AgentTotals()
        start_committed = committed_total(config)
        LOG.info("streaming shuffle %s: %s -> %s, group %s, staging %s", run_key, config.reports_topic,
                 config.shuffled_topic, config.group_id, root)
        with contextlib.ExitStack() as stack:
            metrics = None
            if config.metrics_port:  # before the pipeline starts: a port taken must not orphan a submitted job
                metrics = JobMetrics("shuffle")
                stack.enter_context(metrics.serve(config.metrics_port, config.metrics_host))
                metrics.set_status("running")
            pipeline = PipelineThread(lambda p: build(p, config, ledger, root, run_key), options)
            lost_counters = False
            try:
                counters, suspended = _serve(pipeline, agent, root, config, started, start_committed, metrics)
            except JobServerLostError as lost:  # never cancelled: its open windows' offsets are committed
                if not pipeline.drain_requested:
                    raise keep_lost_job(config, lineage, agent, lost) from None
                finish_lost_drain(lost, agent, pipeline.drain_again)  # the drain goes on without the server
                counters, suspended, lost_counters = {}, None, True
            except BaseException:
                pipeline.cancel()  # a cluster job must not outlive the driver that releases its windows
                raise
            _observe(metrics, agent, config)
        remove_stop_file(root)
    seconds = time.perf_counter() - started
    LOG.info("streaming shuffle %s ended after %.1f s: %s", run_key, seconds,
             progress(agent.totals, committed_total(config), start_committed, seconds))
    parts = {"dead_lettered": counters.get("dead_lettered", 0), "reread": counters.get("records_reread", 0),
             "held": counters.get("sets_held", 0), "deleted": counters.get("sets_deleted", 0),
             "duplicate": counters.get("sets_duplicate", 0),
             "released": counters.get("sets_released", 0)}
    totals = agent.totals
    extra: dict[str, Any] = {"releases": totals.released, "conflicts": totals.conflicts, "withheld": totals.withheld,
                             "run_key": run_key, "windows": totals.windows, "dead_letters": totals.dead_letters,
                             "dummies": totals.dummies}
    read = None
    if suspended is not None or savepoint is not None or lost_counters or not pipeline.counters_complete():
        # The counters hold the last attempt only (or the job goes on from a savepoint): durable facts instead
        extra["accounting_from"] = "durable facts (committed offsets, staged set counts, dead letters)"
        read, parts = stream_accounting.durable(config, lineage, totals, counters)
        if suspended is not None:  # the sets of the windows still open are in the savepoint
            parts["held"] = read - sum(parts.values())
            stream_accounting.suspend(config, lineage, totals, counters, suspended)
            extra["savepoint"] = suspended
    return RunSummary(counters, config.out_dir, seconds, STAGE, parts, extra,
                      dead_letters_dir=config.state_layout.dead_letters, records_read=read)

