"""The edge with Kafka unreachable: reports are spooled (202) until the spool is full, then 503 + Retry-After with a
problem document; a device over its rate gets 429 + Retry-After; nothing refused reaches the spool."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.edge.client import EdgeClient
from tests.edge.harness import REPO, EdgeProcess
from tests.transforms.release_inputs import WIN_A, Devices, make_spec

pytestmark = pytest.mark.slow


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_kafka_spools_then_503_and_rate_limit_429(tmp_path: Path) -> None:
    devices = Devices.enrol(tmp_path / "keys", 40)
    spec = make_spec("grr", size=8)
    bodies = [r.value for r in devices.crowd(spec, devices.clients, WIN_A)]
    limit = 10 * (len(bodies[0]) + 8) + 4  # room for 10 framed reports
    with EdgeProcess(f"127.0.0.1:{_closed_port()}", devices.keys_dir, tmp_path / "spool", tmp_path / "edge.log",
                     "--ack_timeout_seconds", "0.5", "--spool_max_bytes", str(limit), "--rate_per_device", "0.01",
                     "--burst_per_device", "1") as edge:
        client = EdgeClient(edge.url)
        statuses = [client.post_report(body) for body in bodies[:20]]
        assert [a.status for a in statuses[:10]] == [202] * 10  # on disk: Kafka is not there
        assert {a.status for a in statuses[10:]} == {503}
        problem = json.loads(statuses[-1].body)
        assert problem["type"] == "urn:esa:problem:unavailable" and problem["status"] == 503
        assert statuses[-1].retry_after is not None and statuses[-1].retry_after >= 1
        over = client.post_report(bodies[0])  # the first device again, within its rate
        assert over.status == 429 and over.retry_after is not None and over.retry_after >= 1
        assert json.loads(over.body)["type"] == "urn:esa:problem:rate-limited"
        health = json.loads(client.request("GET", "/healthz").body)
        assert health["kafka"] == "down" and health["spool_records"] == 10
        # enrolment is by token (the default): none or a forged one is 403; a minted one passes admission, and
        # with Kafka away the devices topic cannot be written: 503, not a silent success
        key = devices.fleet.public_key(devices.clients[0])
        assert client.enrol(key).status == 403
        assert client.enrol(key, token="v1.9999999999." + "0" * 64).status == 403
        minted = subprocess.run([sys.executable, "-m", "pipelines.cli", "edge-token", "--keys_dir",
                                 str(devices.keys_dir), "--public_key", key.hex()], cwd=REPO, capture_output=True,
                                text=True, timeout=300)
        assert minted.returncode == 0, minted.stderr
        other_key = devices.fleet.public_key(devices.clients[1])
        assert client.enrol(other_key, token=minted.stdout.strip()).status == 403  # bound to its key
        answer = client.enrol(key, token=minted.stdout.strip())
        assert answer.status == 503 and answer.retry_after is not None
        metrics = client.request("GET", "/metrics").body.decode()
        assert "esa_edge_spool_records 10.0" in metrics and "esa_edge_kafka_up 0.0" in metrics
        assert 'esa_edge_requests_total{route="reports",status="503"} 10.0' in metrics
        client.close()


def test_a_taken_port_is_one_line_and_exit_3(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "pipelines.cli", "edge", "--kafka_bootstrap", "127.0.0.1:1",
                               "--keys_dir", str(tmp_path / "keys"), "--port", str(port), "--spool_dir",
                               str(tmp_path / "spool")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3 and f"--port {port}" in done.stderr and "Traceback" not in done.stderr
