"""A streaming job's stop on a Flink cluster: Flink's stop-with-savepoint with ``drain`` (REST ``POST
/jobs/<id>/stop``), asked by the streaming shuffler's driver right after it wrote its stop file.

Why: with checkpointing on, Beam's Flink runner keeps the job's source task (the ``Impulse`` before the Kafka
SDF) running for ever, so a job whose read has finished and whose windows have all fired still never ends
(measured on Flink 1.19.3 with Beam 2.62: RUNNING minutes after the read finished at the stop file). Beam's
``shutdown_sources_after_idle_ms`` is no way out: once the ``Impulse`` task ends, Beam's runner drives the SDF
from its ``flushData`` loop, which blocks checkpoints, hence offset commits, for the rest of the read. A drain
ends the source instead; the SDF, reading on in that loop, sees the stop file at its next bundle and finishes;
the watermark reaches the end of time, every open window fires, the final savepoint completes (finalizing the
last bundles: their offsets are committed) and the job is FINISHED, which ends the driver's wait.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

LOG = logging.getLogger("esa.flink_drain")
LOCAL_MASTERS = {"[local]", "[auto]", "[collection]", ""}
TERMINAL = frozenset({"FINISHED", "FAILED", "CANCELED"})  # Flink's globally terminal job states


def flink_rest(options: Any) -> str | None:
    """The cluster's REST address when the job runs on a Flink cluster (not one embedded in the job server)."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, StandardOptions

    runner = str(options.view_as(StandardOptions).runner or "")
    master = str(options.view_as(FlinkRunnerOptions).flink_master or "")
    if runner.rsplit(".", 1)[-1] != "FlinkRunner" or master in LOCAL_MASTERS:
        return None
    return master.removeprefix("http://").removeprefix("https://").rstrip("/")


def _call(rest: str, path: str, body: dict | None = None, timeout_s: float = 30.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{rest}{path}", data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def flink_job_id(rest: str, beam_job_id: str) -> str | None:
    """The running Flink job of a Beam job: Beam names the Flink job by the invocation id before its ``_uuid``."""
    name = beam_job_id.rsplit("_", 1)[0]
    for job in _call(rest, "/jobs/overview")["jobs"]:
        if job.get("name") == name and job.get("state") == "RUNNING":
            return str(job["jid"])
    return None


def drain(rest: str, beam_job_id: str) -> tuple[str, str] | None:
    """Ask the cluster to stop the job with a drain (into its configured savepoint directory): the Flink job id
    and the request's id, to follow with ``drain_failure``. A failure is logged, not raised (None): the caller
    asks again, the operator can drain by hand (``flink stop --drain``)."""
    try:
        jid = flink_job_id(rest, beam_job_id)
        if jid is None:
            LOG.warning("no running Flink job for %s on %s: nothing to drain yet", beam_job_id, rest)
            return None
        trigger = _call(rest, f"/jobs/{jid}/stop", {"drain": True})
    except Exception as err:
        LOG.warning("could not ask %s to drain the job (stop it by hand: flink stop --drain): %s", rest, err)
        return None
    LOG.info("asked Flink to drain job %s (request %s)", jid, trigger.get("request-id"))
    return jid, str(trigger.get("request-id"))


def drain_job(rest: str, jid: str) -> None:
    """Ask Flink to drain job ``jid`` unless a savepoint (a drain's) is under way; a failure is logged (debug):
    the caller looks again (``pipelines.stream_orphan.finish_drain``)."""
    try:
        history = _call(rest, f"/jobs/{jid}/checkpoints").get("history") or []
        if not any(h.get("is_savepoint") and h.get("status") == "IN_PROGRESS" for h in history):
            _call(rest, f"/jobs/{jid}/stop", {"drain": True})
    except Exception as err:  # the job ended meanwhile, or the cluster is busy
        LOG.debug("drain of Flink job %s not asked: %s", jid, err)


def drain_failure(rest: str, jid: str, request_id: str) -> str | None:
    """Why the drain ``request_id`` of job ``jid`` failed, once it did; None while it runs or when it succeeded.
    A job whose tasks are not all running yet (just submitted or restored, or restarting) refuses the drain's
    savepoint ("Not all required tasks are currently running"), and the job goes on: it must be asked again."""
    try:
        status = _call(rest, f"/jobs/{jid}/savepoints/{request_id}")
    except Exception as err:  # the JobManager is busy, or the job ended and its trigger is gone: asked later
        LOG.debug("drain request %s of job %s not readable: %s", request_id, jid, err)
        return None
    cause = (status.get("operation") or {}).get("failure-cause")
    if status.get("status", {}).get("id") != "COMPLETED" or not cause:
        return None
    return str(cause.get("stack-trace") or cause).splitlines()[0][:300]


def stop_with_savepoint(rest: str, jid: str, timeout_s: float = 600.0) -> str:
    """Stop the Flink job ``jid`` with a savepoint and no drain (its open windows stay in the savepoint, into the
    cluster's ``state.savepoints.dir``): the savepoint's location once it completed. A job that is restarting
    (a TaskManager died) refuses savepoints until its tasks run again: asked again until ``timeout_s``. A job
    that an earlier request (a killed driver's, still in flight) stopped into a savepoint meanwhile: that one."""
    import time
    import urllib.error

    deadline = time.monotonic() + timeout_s
    failure: object = None
    while time.monotonic() < deadline:
        try:
            trigger = _call(rest, f"/jobs/{jid}/stop", {"drain": False})["request-id"]
            while time.monotonic() < deadline:
                status = _call(rest, f"/jobs/{jid}/savepoints/{trigger}")
                if status["status"]["id"] == "COMPLETED":
                    break
                time.sleep(1.0)
            operation = status.get("operation", {})
            if "location" in operation:
                return str(operation["location"])
            failure = (operation.get("failure-cause") or {}).get("stack-trace", operation)
        except urllib.error.HTTPError as err:  # answered, and refused: the job may have ended meanwhile
            failure = f"HTTP {err.code} {err.reason}"
        state, savepoint = job_savepoint(rest, jid)
        if state == "FINISHED" and savepoint:
            LOG.warning("Flink job %s was stopped into savepoint %s by an earlier request", jid, savepoint)
            return savepoint
        if state in TERMINAL | {"UNKNOWN"}:
            raise RuntimeError(f"Flink job {jid} ended {state} without a savepoint: {str(failure)[:300]}")
        LOG.warning("the savepoint of Flink job %s failed (asked again in 5 s): %s", jid, str(failure)[:300])
        time.sleep(5.0)
    raise RuntimeError(f"no savepoint of Flink job {jid} within {timeout_s:.0f} s: {str(failure)[:500]}")


def job_savepoint(rest: str, jid: str, settle_s: float = 15.0) -> tuple[str, str | None]:
    """The state of Flink job ``jid`` and the location of its latest savepoint (None if it has none):
    ``("UNKNOWN", None)`` if the cluster does not know the job (its history forgets finished jobs after
    ``jobstore.expiration-time``, an hour by default, and a restarted cluster forgets them all). A job just
    FINISHED may not show its final savepoint yet (the REST API's statistics are cached, ``web.refresh-interval``:
    measured None right after a stop-with-savepoint's FINISHED): looked at again for up to ``settle_s``."""
    import time
    import urllib.error

    deadline = time.monotonic() + settle_s
    while True:
        try:
            state = str(_call(rest, f"/jobs/{jid}")["state"])
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return "UNKNOWN", None
            raise
        latest = (_call(rest, f"/jobs/{jid}/checkpoints").get("latest") or {}).get("savepoint") or {}
        if latest.get("external_path"):
            return state, str(latest["external_path"])
        if state != "FINISHED" or time.monotonic() >= deadline:
            return state, None
        time.sleep(1.0)


def restarted(rest: str, jid: str) -> bool:
    """Whether the Flink job ever failed over or was restored from a checkpoint or savepoint: then the runner's
    counters hold its last attempt only. Unknown (the cluster does not answer) counts as restarted."""
    try:
        failures = _call(rest, f"/jobs/{jid}/exceptions")["exceptionHistory"]["entries"]
        restored = (_call(rest, f"/jobs/{jid}/checkpoints").get("latest") or {}).get("restored")
    except Exception as err:
        LOG.warning("could not ask %s whether job %s restarted (taken as restarted): %s", rest, jid, err)
        return True
    return bool(failures) or restored is not None
