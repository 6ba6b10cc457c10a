"""Helpers of the Flink cluster tests: the probe job's jar (compiled with ``javac`` against the cluster's own
jars), job submission through Flink's REST API (``/jars/upload``, ``/jars/<id>/run``) and waiting on a job."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

from pipelines.flink_cluster import LocalFlinkCluster

PROBE_SOURCE = Path(__file__).resolve().parent / "probe" / "CountJob.java"
TERMINAL = {"FINISHED", "FAILED", "CANCELED"}


def build_probe_jar(home: Path, work: Path) -> Path:
    classes = work / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-d", str(classes), "-cp", str(home / "lib" / "*"), str(PROBE_SOURCE)], check=True,
                   capture_output=True, timeout=120)
    jar = work / "probe.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True, capture_output=True, timeout=60)
    return jar


def _post(url: str, body: bytes, content_type: str) -> dict:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def upload(cluster: LocalFlinkCluster, jar: Path) -> str:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"jarfile\"; filename=\"{jar.name}\"\r\n"
            "Content-Type: application/x-java-archive\r\n\r\n").encode() + jar.read_bytes() + \
        f"\r\n--{boundary}--\r\n".encode()
    answer = _post(f"http://{cluster.rest}/jars/upload", body, f"multipart/form-data; boundary={boundary}")
    return str(answer["filename"]).rsplit("/", 1)[-1]


def submit(cluster: LocalFlinkCluster, jar_id: str, args: list[str], parallelism: int = 2) -> str:
    body = json.dumps({"entryClass": "CountJob", "programArgsList": args, "parallelism": parallelism}).encode()
    return str(_post(f"http://{cluster.rest}/jars/{jar_id}/run", body, "application/json")["jobid"])


def job(cluster: LocalFlinkCluster, job_id: str) -> dict:
    return cluster.get(f"/jobs/{job_id}")


def wait_state(cluster: LocalFlinkCluster, job_id: str, states: set[str], timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        details = job(cluster, job_id)
        if details["state"] in states:
            return details
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not in {states} within {timeout_s:.0f} s: {details['state']}")


def written_numbers(out: Path) -> list[int]:
    """Every number in the committed part files (in-progress and pending files are hidden: ``.part-...``)."""
    numbers: list[int] = []
    for part in out.rglob("part-*"):
        numbers.extend(int(line) for line in part.read_text().split())
    return numbers


def completed_checkpoints(cluster: LocalFlinkCluster, job_id: str) -> int:
    return int(cluster.get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"])


def stop_with_savepoint(cluster: LocalFlinkCluster, job_id: str, timeout_s: float = 120) -> str:
    """Flink's stop-with-savepoint (``POST /jobs/<id>/stop``, into the cluster's savepoint directory): the
    savepoint's location once it completed."""
    body = json.dumps({"targetDirectory": (cluster.directory / "savepoints").as_uri(), "drain": False}).encode()
    trigger = _post(f"http://{cluster.rest}/jobs/{job_id}/stop", body, "application/json")["request-id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = cluster.get(f"/jobs/{job_id}/savepoints/{trigger}")
        if status["status"]["id"] == "COMPLETED":
            operation = status["operation"]
            assert "location" in operation, operation
            return str(operation["location"])
        time.sleep(0.3)
    raise AssertionError(f"the savepoint of {job_id} did not complete within {timeout_s:.0f} s")


def submit_from_savepoint(cluster: LocalFlinkCluster, jar_id: str, args: list[str], savepoint: str,
                          parallelism: int = 2) -> str:
    body = json.dumps({"entryClass": "CountJob", "programArgsList": args, "parallelism": parallelism,
                       "savepointPath": savepoint}).encode()
    return str(_post(f"http://{cluster.rest}/jars/{jar_id}/run", body, "application/json")["jobid"])
