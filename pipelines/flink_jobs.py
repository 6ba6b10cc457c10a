"""A bounded run's Flink job outlives its driver and its job server: what the driver does about it.

Measured on a Flink 1.19.3 session cluster with Beam 2.62.0's job server (docs/deployment.md, "When a driver
or its job server dies"): a job the job server submitted runs on whatever happens to the submitting side. SIGKILL
of the driver's process group (driver, job server watchdog and JVM) leaves the Flink job RUNNING, and it would
finish on its own; SIGKILL of the job server's JVM alone does too, while the driver's wait fails. Such an
orphan writes the run's staged files for as long as it runs, and it holds task slots.

So, on a Flink cluster (``--flink_master HOST:PORT``), each bounded run:

- names its Flink job after its state directory: ``esa-<stage>-<id>``, the id drawn once and kept in
  ``STATE/flink-job.id`` (``--job_name N`` gives ``N-<stage>-<id>``). One driver holds a state directory's lock
  at a time, so a live job of that name on the cluster is an orphan of an earlier driver of this directory;
- before it plans, cancels any such orphan through the cluster's REST API and waits until it is gone (exit 10
  if it will not go): the rerun never shares the cluster, or the staging root it is about to clear, with it;
- when its wait on the job fails because the job server went away (a killed or crashed JVM, an unreachable
  ``--job_endpoint``), cancels its own Flink job and fails in one line with exit 10 (``RunnerLostError``).
  Interrupted (SIGINT, SIGTERM) during the wait, it cancels its job too.

The staged files are fenced as well (``pipelines.job.plan_run``: each attempt stages in its own directory), so
even a job that could not be cancelled in time, or a harness that writes after its job was cancelled, never
writes into what a later attempt reads.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from apache_beam.options.pipeline_options import GoogleCloudOptions, PortableOptions

from pipelines.exit_codes import RunnerLostError
from pipelines.flink_drain import TERMINAL, flink_rest
from transforms.state.files import create_exclusive

LOG = logging.getLogger("esa.flink_jobs")
CANCEL_TIMEOUT_S = 300.0  # a loaded 2-core machine: tasks close, harnesses stop
REST_TIMEOUT_S = 30.0


def _rest(rest: str, path: str, method: str = "GET") -> dict:
    request = urllib.request.Request(f"http://{rest}{path}", method=method)
    with urllib.request.urlopen(request, timeout=REST_TIMEOUT_S) as response:
        body = response.read()
    return json.loads(body) if body.strip() else {}


def job_name(config: Any, stage: str, prefix: str | None = None) -> str:
    """This state directory's Flink job name for ``stage`` (drawn once, kept in the state directory)."""
    path = config.state_layout.flink_job_id
    create_exclusive(path, secrets.token_hex(6).encode())  # no-op when it exists
    return f"{prefix or 'esa'}-{stage}-{path.read_text().strip()}"


def live_jobs(rest: str, name: str) -> list[dict]:
    """The jobs named ``name`` on the cluster that are not in a terminal state."""
    return [j for j in _rest(rest, "/jobs/overview")["jobs"] if j.get("name") == name and j["state"] not in TERMINAL]


def cancel_jobs(rest: str, name: str, why: str, timeout_s: float = CANCEL_TIMEOUT_S) -> list[str]:
    """Cancel every live job named ``name`` and wait until none is live; the ids cancelled. RunnerLostError if
    one is still live after ``timeout_s``."""
    cancelled: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = live_jobs(rest, name)
        if not jobs:
            return cancelled
        for job in jobs:
            if job["jid"] not in cancelled:
                LOG.warning("cancelling Flink job %s (%s, %s) on %s: %s", name, job["jid"], job["state"], rest, why)
                try:
                    _rest(rest, f"/jobs/{job['jid']}?mode=cancel", method="PATCH")
                except urllib.error.HTTPError as err:  # it reached a terminal state meanwhile: seen next round
                    LOG.info("cancel of %s answered %s", job["jid"], err.code)
                cancelled.append(job["jid"])
        if time.monotonic() > deadline:
            raise RunnerLostError(f"the Flink job {name} ({', '.join(j['jid'] for j in jobs)}) on {rest} is still "
                                  f"{jobs[0]['state']} {timeout_s:.0f} s after it was cancelled; cancel it by "
                                  "hand (flink cancel, or REST PATCH /jobs/<id>?mode=cancel) and run again")
        time.sleep(1.0)


def adopt_flink_job(config: Any, stage: str, options: Any) -> str | None:
    """Before a bounded run plans on a Flink cluster: name its Flink job (on ``options``) and cancel what an
    earlier driver of this state directory left running under that name. The name, or None off a cluster."""
    rest = flink_rest(options) if options is not None else None
    if rest is None:
        return None
    cloud = options.view_as(GoogleCloudOptions)
    # ``esa run`` shares one options object among its stages: a name set for an earlier stage is not --job_name.
    prefix = _NAMED.get(cloud.job_name, cloud.job_name) if cloud.job_name else None
    name = job_name(config, stage, prefix)
    _NAMED[name] = prefix
    cloud.job_name = name
    try:
        cancelled = cancel_jobs(rest, name, "an earlier driver of this state directory left it (the driver died)")
    except OSError as err:  # unreachable: the submission will say so, and no job of ours can run there
        LOG.warning("could not list the jobs on %s (%s): an earlier run's job cannot be checked for", rest, err)
        return name
    if cancelled:
        LOG.warning("%s: cancelled %d Flink job(s) an earlier driver of %s left on %s: %s", stage, len(cancelled),
                    config.state, rest, ", ".join(cancelled))
    return name


_NAMED: dict[str, str | None] = {}  # the job names this process set -> the --job_name prefix they carry


def job_server_answers(endpoint: str | None, timeout_s: float = 10.0) -> bool:
    """Whether the job server at ``HOST:PORT`` answers a Job API call. Not a TCP connect: the listening socket
    of a JVM being killed still completes handshakes for a moment (measured: a connect 26 ms after the SIGKILL
    succeeded, after the driver's stream had already failed)."""
    if not endpoint:
        return True
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    channel = grpc.insecure_channel(endpoint)
    try:
        beam_job_api_pb2_grpc.JobServiceStub(channel).GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=timeout_s)
        return True
    except grpc.RpcError:
        return False
    finally:
        channel.close()


def _unavailable(err: BaseException) -> bool:
    """The job server's connection dropped (gRPC UNAVAILABLE): the driver can no longer follow its job."""
    code = getattr(err, "code", None)
    return callable(code) and getattr(code(), "name", "") == "UNAVAILABLE"


def job_server_lost(err: BaseException, endpoint: str | None) -> bool:
    """Whether a failed submission or wait means the job server went away: its stream dropped (UNAVAILABLE),
    or it answers no Job API call now (an interrupt is never a lost job server)."""
    return isinstance(err, Exception) and (_unavailable(err) or not job_server_answers(endpoint))


@contextmanager
def owned_flink_job(options: Any) -> Iterator[None]:
    """Around a bounded run's submission and wait: if they fail on a Flink cluster, cancel the run's Flink job
    (named by ``adopt_flink_job``) rather than leave it running; a job server that went away is exit 10."""
    rest = flink_rest(options) if options is not None else None
    name = options.view_as(GoogleCloudOptions).job_name if rest else None
    endpoint = options.view_as(PortableOptions).job_endpoint if rest else None
    if not rest or not name:
        yield
        return
    quiet_message_thread()
    try:
        yield
    except BaseException as err:
        lost = job_server_lost(err, endpoint)
        why = ("its job server went away" if lost else f"its driver stopped ({type(err).__name__})")
        try:  # an interrupted driver waits briefly: its orchestrator's grace period is short; a rerun cancels too
            cancelled = cancel_jobs(rest, name, why, CANCEL_TIMEOUT_S if lost else 20.0)
            outcome = (f"its Flink job {name} on {rest} was cancelled ({', '.join(cancelled)})" if cancelled else
                       f"no job {name} is left running on {rest}")
        except (OSError, RunnerLostError) as cancel_err:
            outcome = f"its Flink job {name} on {rest} could not be cancelled ({one_line(cancel_err)}): the next " \
                      "run cancels it"
            LOG.warning("%s", outcome)
        if not lost:
            raise
        raise RunnerLostError(f"the Flink job server {endpoint} went away mid-run ({one_line(err)}); {outcome}; "
                              "nothing was released or committed: run the same command again") from None


def quiet_message_thread() -> None:
    """Beam's thread that reads the job's messages dies with a traceback on stderr when the job server goes
    away (``wait_until_finish_read``: gRPC UNAVAILABLE), beside the one line this module reports: log it at
    DEBUG instead. Installed once per process; every other thread's uncaught exception is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "esa_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if (args.thread is not None and args.thread.name == "wait_until_finish_read"
                and type(args.exc_value).__module__.startswith("grpc")):
            LOG.debug("Beam's job message stream ended: %s", one_line(args.exc_value or Exception()))
            return
        previous(args)

    hook.esa_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def one_line(err: BaseException) -> str:
    """An error's first line; a gRPC error's status details (``Socket closed``, ``Connection refused``)."""
    details = getattr(err, "details", None)
    text = str((details() if callable(details) else None) or err)
    return (text.strip().splitlines() or [type(err).__name__])[0][:200]
