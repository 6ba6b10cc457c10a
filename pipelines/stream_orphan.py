"""The streaming shuffler's Flink job outlives a killed driver: the next driver of the state directory finds it,
stops it into a savepoint and resumes it.

A SIGKILLed driver (its process group, a pod deleted, an OOM kill) leaves its Flink job RUNNING on the cluster:
the job keeps reading, committing offsets at checkpoints and staging releases that no driver seals, and its
open windows live only in its state. A rerun that simply submitted would put a second job in the same consumer
group. Cancelling the orphan would lose its open windows (their records' offsets are committed). So, as the
bounded runs do (``pipelines.flink_jobs``), each streaming run names its Flink job after its state directory,
``esa-stream-<id>`` (one driver holds the directory's lock: a live job of that name is an earlier driver's
orphan), and before it submits:

- stops such an orphan **with a savepoint and no drain** (REST ``POST /jobs/<id>/stop``): its open windows
  stay in the savepoint, none fires early;
- carries the dead run's part of the record accounting (``pipelines.stream_accounting.adopt``);
- resumes from that savepoint (``--savepoint_path`` set for this run), logging one line that says so.

This is what docs/deployment.md told the operator to do by hand, done by the one process that holds the state
lock; refusing instead would leave the orphan staging releases nobody seals until someone acts, and the quick
manual action (cancel) is the one that loses windows. A savepoint that cannot be taken (the job keeps failing
over) stops the run with exit 10 and the exact commands, the orphan left running.

A driver that lives on while its job server dies (its wait fails) must not cancel its job either, for the same
reason (``keep_lost_job``): it stops the job into a savepoint itself, carries its run's accounting, marks the
lineage to be resumed by the next run unasked and exits 10; where the savepoint fails, the job is left running
for the next run to stop and resume as above.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions

from pipelines import stream_accounting
from pipelines.exit_codes import RunnerLostError
from pipelines.flink_drain import TERMINAL, drain_job, flink_rest, job_savepoint, stop_with_savepoint
from pipelines.flink_jobs import job_name, live_jobs, one_line
from pipelines.job import staging_root
from pipelines.job_config import JobConfig
from transforms.io.staging import is_url, join
from transforms.shuffler.release_step import STAGE as SHUFFLE_STAGE
from transforms.shuffler.streaming import STOP_FILE
from transforms.state.ledger import ReleaseLedger

LOG = logging.getLogger("esa.stream_orphan")
STAGE = "stream"  # esa-stream-<id>: not the bounded shuffle's name, whose rerun cancels (loses open windows)
LOST_SAVEPOINT_S = 180.0  # a job restoring refuses savepoints for a while; the next run tries 10 more minutes
DRAIN_S = 600.0  # a drain asked before the driver died or lost its job server, waited for (asked again if refused)


def stream_root(config: JobConfig) -> str:
    """Where the streaming job stages its releases, dead letters and the stop file."""
    return join(staging_root(config, SHUFFLE_STAGE), "stream")


def drain_asked(config: JobConfig) -> bool:
    """Whether a driver of this state directory asked its job to drain (it wrote the stop file, which only a run
    that ends removes): such a job fires every window and finishes; its final savepoint is no place to resume."""
    path = join(stream_root(config), STOP_FILE)
    return FileSystems.exists(path) if is_url(path) else Path(path).exists()


def finish_drain(rest: str, jid: str, ask: Any, timeout_s: float = DRAIN_S) -> None:
    """Wait until the draining Flink job ``jid`` is FINISHED, calling ``ask()`` meanwhile (it asks the drain
    again when the job refused it: its tasks were restoring). RunnerLostError if it ends otherwise, or not."""
    import time

    deadline, asked = time.monotonic() + timeout_s, 0.0
    while True:
        state, _ = job_savepoint(rest, jid)
        if state == "FINISHED":
            return
        if state in TERMINAL | {"UNKNOWN"}:
            raise RunnerLostError(f"the draining Flink job {jid} on {rest} ended {state}, not FINISHED: the windows "
                                  "it had not fired are lost; run the same command again to start a new lineage")
        if time.monotonic() >= deadline:
            raise RunnerLostError(f"the Flink job {jid} on {rest} did not finish its drain within {timeout_s:.0f} s; "
                                  f"it is still {state}: run the same command again (it waits for the drain)")
        if time.monotonic() - asked >= 5.0:
            asked = time.monotonic()
            ask()
        time.sleep(1.0)


def resume_orphan(config: JobConfig, ledger: ReleaseLedger, options: Any) -> str | None:
    """Name this run's Flink job; if a dead driver of this state directory left one running, stop it into a
    savepoint, carry the dead run's accounting and return the savepoint to resume from (else None)."""
    rest = flink_rest(options) if options is not None else None
    if rest is None:
        return None
    cloud = options.view_as(GoogleCloudOptions)
    name = job_name(config, STAGE, cloud.job_name or None)
    cloud.job_name = name
    try:
        jobs = live_jobs(rest, name)
    except OSError as err:  # unreachable: the submission will say so
        LOG.warning("could not list the jobs on %s (%s): an earlier driver's job cannot be checked for", rest, err)
        jobs = []
    if not jobs:
        return _resume_kept(config, options) or _resume_stopped(config, ledger, rest, options)
    if len(jobs) > 1:
        raise RunnerLostError(f"{len(jobs)} live Flink jobs named {name} on {rest} "
                              f"({', '.join(j['jid'] for j in jobs)}): stop all but one with a savepoint by hand "
                              "(flink stop <jid>) and run again")
    jid = jobs[0]["jid"]
    if drain_asked(config):  # its driver asked a drain and died: let it fire its windows and finish
        LOG.warning("the Flink job %s (%s) of a dead driver of %s is draining (its stop file is there): waiting "
                    "for it to finish; the releases it staged are sealed next, and a new lineage starts",
                    name, jid, config.state)
        finish_drain(rest, jid, lambda: drain_job(rest, jid))
        return None
    stream_accounting.mark_stopping(config.state, jid)
    try:
        savepoint = stop_with_savepoint(rest, jid)
    except Exception as err:
        stream_accounting.mark_stopping(config.state, None)
        raise RunnerLostError(f"the Flink job {name} ({jid}) an earlier driver of {config.state} left on {rest} "
                              f"could not be stopped into a savepoint ({str(err)[:200]}); it is still running: "
                              f"stop it by hand (flink stop {jid}, or REST POST /jobs/{jid}/stop) and run again "
                              "with --savepoint_path <its savepoint>") from None
    stream_accounting.adopt(config, ledger, savepoint)
    set_savepoint(options, savepoint)
    LOG.warning("the Flink job %s (%s) of a dead driver of %s was still running on %s: stopped into savepoint %s; "
                "resuming from it (its open windows included)", name, jid, config.state, rest, savepoint)
    return savepoint


def _resume_stopped(config: JobConfig, ledger: ReleaseLedger, rest: str, options: Any) -> str | None:
    """A driver asked Flink to stop its job into a savepoint and was killed (SIGKILL, or SIGTERM) before it
    recorded where: the job finished into a savepoint that only the cluster knows. Resume from it, carrying the
    dead run's part; starting afresh would lose its open windows (their records' offsets are committed)."""
    jid = stream_accounting.stopping(config.state)
    if jid is None:
        return None
    try:
        state, savepoint = job_savepoint(rest, jid)
    except OSError as err:
        raise RunnerLostError(f"the last driver of {config.state} asked Flink to stop job {jid} into a savepoint "
                              f"and was killed before it recorded where; {rest} cannot be asked ({one_line(err)}): "
                              "run again once it answers") from None
    given = stream_accounting.savepoint_path(options)
    if state == "UNKNOWN" and given and PurePosixPath(given.rstrip("/")).name.startswith(f"savepoint-{jid[:6]}-"):
        state, savepoint = "FINISHED", given  # forgotten by the cluster; the operator found its savepoint
    if state == "FINISHED" and savepoint:
        stream_accounting.adopt(config, ledger, savepoint)
        set_savepoint(options, savepoint)
        LOG.warning("the last driver of %s was killed while its Flink job %s was being stopped; the job stopped "
                    "into savepoint %s: resuming from it (its open windows included)", config.state, jid, savepoint)
        return savepoint
    if state in {"CANCELED", "FAILED"}:
        stream_accounting.mark_stopping(config.state, None)
        LOG.warning("the last driver of %s was killed while its Flink job %s was being stopped into a savepoint, and "
                    "that job ended %s without one: the windows it held open are lost; a new lineage starts from the "
                    "committed offsets", config.state, jid, state)
        return None
    raise RunnerLostError(f"the last driver of {config.state} asked Flink to stop job {jid} into a savepoint and "
                          f"was killed before it recorded where; {rest} "
                          f"{'no longer knows that job' if state == 'UNKNOWN' else f'shows it {state}'}: run again "
                          f"with --savepoint_path <its savepoint: savepoint-{jid[:6]}-... under the cluster's "
                          f"state.savepoints.dir>, or remove {config.state / stream_accounting.LINEAGE_FILE} to "
                          "start afresh without the windows it held open")


def _resume_kept(config: JobConfig, options: Any) -> str | None:
    """The savepoint the last driver stopped its job into when its job server went away, set for this run."""
    kept = stream_accounting.resumable(config.state)
    if kept is not None:
        set_savepoint(options, kept)
        LOG.warning("the last driver of %s lost its job server and stopped its Flink job into savepoint %s: "
                    "resuming from it (its open windows included)", config.state, kept)
    return kept


@dataclass
class JobServerLostError(Exception):
    """The driver's wait on its cluster job failed because its job server went away (``keep_lost_job``)."""
    rest: str  # the cluster's REST address
    name: str  # the Flink job's name (``esa-stream-<id>``)
    jid: str | None  # its id, if the driver had found it
    endpoint: str | None  # the job server's
    why: str  # the wait's error, one line


def keep_lost_job(config: JobConfig, lineage: Any, agent: Any, lost: JobServerLostError) -> RunnerLostError:
    """The job server went away under this live driver (its wait failed): stop its Flink job into a savepoint
    (never cancel it: its open windows' offsets are committed), seal what the job staged before it stopped,
    carry this run's accounting and mark the lineage to be resumed by the next run. The one-line error to exit
    with (10). Where the job cannot be stopped into a savepoint it is left running (the next run stops and
    resumes it, ``resume_orphan``); this run's part is then carried from its durable facts, as a dead driver's."""
    rest, name, jid = lost.rest, lost.name, lost.jid
    head = f"the Flink job server {lost.endpoint} went away mid-run ({lost.why}); its Flink job {name}"
    try:
        if jid is None:
            jobs = live_jobs(rest, name)
            if not jobs:
                return RunnerLostError(f"{head} is not running on {rest}: run the same command again")
            jid = str(jobs[0]["jid"])
        stream_accounting.mark_stopping(config.state, jid)  # a SIGTERM or SIGKILL while it waits loses nothing
        savepoint = stop_with_savepoint(rest, jid, LOST_SAVEPOINT_S)
    except Exception as err:  # unreachable REST, a savepoint refused for minutes: the job goes on
        stream_accounting.mark_stopping(config.state, None)
        LOG.warning("could not stop Flink job %s (%s) into a savepoint: %s", name, jid, err)
        return RunnerLostError(f"{head} ({jid}) on {rest} could not be stopped into a savepoint "
                               f"({one_line(err)[:150]}); it is still running, its open windows in its state: run "
                               "the same command again (it stops the job into a savepoint and resumes it)")
    agent.step()  # the windows the job fired before it stopped
    # This run's exact copies and re-reads were the runner's counters, gone with its job server: counted as 0,
    # so if it had any the drain's check fails (exit 1), never passes wrongly (as for a dead driver's run).
    stream_accounting.suspend(config, lineage, agent.totals, {}, savepoint, resume=True)
    return RunnerLostError(f"{head} ({jid}) on {rest} was stopped into savepoint {savepoint}; its open windows are "
                           "kept there: run the same command again (it resumes from it)")


def finish_lost_drain(lost: JobServerLostError, agent: Any, drain_again: Any) -> None:
    """The job server went away while the job drained (SIGINT or SIGTERM had asked the drain): the job goes on
    firing its windows without it. Wait for it to finish (asking the drain again if the job refused it), then
    seal what it staged; the run's accounting is taken from durable facts (its counters went with the server)."""
    if lost.jid is None:
        raise RunnerLostError(f"the Flink job server {lost.endpoint} went away while the job drained ({lost.why}) and "
                              f"its Flink job {lost.name} was never found on {lost.rest}: run the same command again")
    LOG.warning("the Flink job server %s went away while the job drained (%s): waiting for the drain of Flink job "
                "%s on %s", lost.endpoint, lost.why, lost.jid, lost.rest)
    finish_drain(lost.rest, lost.jid, drain_again)
    agent.step()  # the windows the drain fired


def set_savepoint(options: Any, savepoint: str) -> None:
    """``--savepoint_path`` for this run. Beam 2.62 passes it to the job server as an unknown flag (no option
    class declares it), so it is added to the options' flags, which every view shares; one given on the command
    line is dropped (the orphan's savepoint is newer)."""
    flags = options._flags  # Beam's options keep their command line here, read at submission
    kept, skip = [], False
    for flag in flags:
        if skip or flag.startswith("--savepoint_path"):
            LOG.warning("%s replaced by the dead driver's job's newer savepoint", flag)
            skip = flag == "--savepoint_path"  # its value is the next token
            continue
        kept.append(flag)
    flags[:] = [*kept, f"--savepoint_path={savepoint}"]
