"""``esa edge`` on a real broker: Python devices enrol and report over HTTP, malformed bodies are refused, and no
network metadata reaches any output (topics, log, metrics, spool)."""

from __future__ import annotations

import http.client
import json
import pickle
import secrets
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from apache_beam.pvalue import TaggedOutput

from pipelines.edge.client import EdgeClient
from tests.edge.harness import EdgeProcess, topic_records, wait_for
from transforms.device import Client
from transforms.io.kafka.bounded import ensure_topics
from transforms.shuffler.elements import TimePolicy
from transforms.shuffler.ingress import IngressFn
from transforms.spec import spec_from_dict
from transforms.state.prior_runs import PriorRuns
from transforms.trust.devices import DeviceRegistry, device_id_of
from transforms.trust.enrolment import enrolment_record
from transforms.trust.envelope import seal_envelope
from transforms.trust.keys import init_keys, load_shuffler_sealing_public

pytestmark = pytest.mark.slow
DEVICES = 300
CLIENT_ADDRESS = "127.0.0.77"  # the devices' own loopback address, so a leak of it is recognisable
USER_AGENT = "EsaPrivacyProbe/9.9 (agent-marker-5f3a)"
FORWARDED = "203.0.113.77"
SPEC = spec_from_dict({"analysis": {"name": "edge_test", "kind": "histogram"}, "domain": {"size": 8},
                       "mechanism": {"name": "grr", "epsilon": 1.0}, "window": {"size_seconds": 3600}})


class ProbeClient(EdgeClient):
    """An EdgeClient that sends from 127.0.0.77 with a marked User-Agent and X-Forwarded-For, and remembers the
    source ports it used."""

    ports: ClassVar[set[int]] = set()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=60,
                                                    source_address=(CLIENT_ADDRESS, 0))
            self._conn.connect()
            ProbeClient.ports.add(self._conn.sock.getsockname()[1])
        return self._conn

    def request(self, method, path, body=None, content_type=None, headers=None):
        marked = {"User-Agent": USER_AGENT, "X-Forwarded-For": FORWARDED, **(headers or {})}
        return super().request(method, path, body, content_type, marked)


@pytest.fixture
def edge_env(broker, topic_name: str, tmp_path: Path):
    keys = tmp_path / "keys"
    init_keys(keys)
    reports, devices = f"{topic_name}-reports", f"{topic_name}-devices"
    ensure_topics(broker.bootstrap, [reports, devices], partitions=2)
    edge = EdgeProcess(broker.bootstrap, keys, tmp_path / "spool", tmp_path / "edge.log", "--enrolment", "open",
                       "--reports_topic", reports, "--devices_topic", devices)
    with edge:
        yield edge, keys, reports, devices


def test_300_devices_enrol_and_report_over_http_and_nothing_leaks(broker, edge_env, tmp_path: Path) -> None:
    edge, keys, reports, devices_topic = edge_env
    http_client = ProbeClient(edge.url)
    current = http_client.keys()  # the signed keys document, as a device fetches it
    assert current.shuffler_key_id == load_shuffler_sealing_public(keys)[0]
    clients = [Client(SPEC, tmp_path / "devices" / str(i), rng=np.random.default_rng(i), **current.client_kwargs())
               for i in range(DEVICES)]
    for i, client in enumerate(clients):
        enrolled = http_client.enrol(client.public_key)
        assert enrolled.status == 200, enrolled
        assert json.loads(enrolled.body)["device_id"] == client.device_id
        answer = http_client.post_report(client.encode(i % 8))
        assert answer.status == 202, answer
    assert http_client.enrol(clients[0].public_key).status == 200  # idempotent

    wait_for(lambda: len(topic_records(broker.bootstrap, reports)) >= DEVICES, what="300 reports in Kafka")
    records = topic_records(broker.bootstrap, reports)
    assert len(records) == DEVICES
    assert all(r.key is None and r.timestamp_ms % 60_000 == 0 for r in records)  # no key, no request time

    # the shuffler's ingress, with the registry the devices topic holds: every set authenticated, none dead
    enrolled = topic_records(broker.bootstrap, devices_topic)
    registry = DeviceRegistry()
    registry.enroll([r.value[-32:] for r in enrolled])  # the value ends with the raw public key
    assert {r.key.decode() for r in enrolled} == {c.device_id for c in clients}
    assert all(r.key.decode() == device_id_of(r.value[-32:]) for r in enrolled)
    assert all(enrolment_record(r.value[-32:]) == (r.key, r.value) for r in enrolled)
    registry.save(tmp_path / "registry.parquet")
    now_ms = int(records[0].timestamp_ms) + 60_000
    ingress = IngressFn([SPEC], str(tmp_path / "registry.parquet"), PriorRuns(),
                        TimePolicy(now_ms, 86_400_000, 3_600_000), keys_dir=str(keys))
    ingress.setup()
    out = list(ingress.process(records))
    dead = [o.value for o in out if isinstance(o, TaggedOutput) and o.tag == "dead_letters"]
    sets = [s for o in out if not isinstance(o, TaggedOutput) for s in pickle.loads(o[1])]
    assert dead == [] and len(sets) == DEVICES
    assert {s.device_id for s in sets} == {c.device_id for c in clients}

    # 50 malformed bodies: each a 4xx with a problem document, nothing written
    good = clients[1].encode(1)
    shuffler = load_shuffler_sealing_public(keys)
    malformed: list[tuple[bytes, str]] = []
    for i in range(50):
        kind = i % 10
        body, ctype = {
            0: (secrets.token_bytes(200), "application/octet-stream"),
            1: (good[: len(good) // 2], "application/octet-stream"),
            2: (good[:-1] + bytes([good[-1] ^ 0x40]), "application/octet-stream"),
            3: (b"", "application/octet-stream"),
            4: (good, "text/plain"),
            5: (good, "application/json"),
            6: (b"\x01" * 70_000, "application/octet-stream"),  # over 64 KiB
            7: (seal_envelope(shuffler[1], shuffler[0], b"not a message set"), "application/octet-stream"),
            8: (json.dumps({"report": "x"}).encode(), "application/octet-stream"),
            9: (bytes([9]) + good[1:], "application/octet-stream"),  # an unknown envelope version
        }[kind]
        malformed.append((body, ctype))
    statuses = []
    for body, ctype in malformed:
        answer = http_client.request("POST", "/v1/reports", body, ctype)
        statuses.append(answer.status)
        assert 400 <= answer.status < 500, (answer, ctype, len(body))
        assert json.loads(answer.body)["status"] == answer.status
    assert {400, 413, 415} <= set(statuses)
    bad_enrol = http_client.request("POST", "/v1/enrol", b'{"public_key": "zz"}', "application/json")
    assert bad_enrol.status == 400
    metrics = http_client.request("GET", "/metrics").body.decode()
    assert 'esa_edge_requests_total{route="reports",status="202"} 300.0' in metrics
    assert sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith('esa_edge_requests_total{route="reports",status="4')) == 50
    assert len(topic_records(broker.bootstrap, reports)) == DEVICES  # the refused added nothing
    preflight = http_client.request("OPTIONS", "/v1/reports", headers={"Origin": "https://app.example",
                                    "Access-Control-Request-Method": "POST"})
    assert preflight.status == 204  # a browser may post from the operator's pages (CORS)
    raw = http.client.HTTPConnection(*edge.url.rsplit("//", 1)[1].split(":"), timeout=60)
    raw.request("GET", "/v1/keys", headers={"Origin": "https://app.example"})
    response = raw.getresponse()
    response.read()
    assert response.getheader("Access-Control-Allow-Origin") == "*"
    assert "Retry-After" in response.getheader("Access-Control-Expose-Headers")
    etag = response.getheader("ETag")
    raw.request("GET", "/v1/keys", headers={"If-None-Match": etag})
    cached = raw.getresponse()
    assert cached.status == 304 and cached.read() == b""
    raw.close()
    health = json.loads(http_client.request("GET", "/healthz").body)
    assert health["status"] == "ok" and health["kafka"] == "up"
    http_client.close()
    assert edge.stop() == 0

    # privacy at the door: no client address, port, agent or forwarded address in any output
    outputs = {"reports topic": b"".join(r.value + (r.key or b"") for r in topic_records(broker.bootstrap, reports)),
               "devices topic": b"".join(r.value + (r.key or b"") for r in enrolled),
               "edge log": edge.log.read_bytes(), "metrics": metrics.encode()}
    for path in (tmp_path / "spool").rglob("*"):
        if path.is_file():
            outputs[f"spool {path.name}"] = path.read_bytes()
    assert outputs["edge log"] and ProbeClient.ports
    markers = [CLIENT_ADDRESS.encode(), USER_AGENT.encode(), b"agent-marker-5f3a", FORWARDED.encode()]
    for name, data in outputs.items():
        for marker in markers:
            assert marker not in data, f"{marker!r} leaked into the {name}"
    for name in ("edge log", "metrics"):
        text = outputs[name].decode()
        for port in ProbeClient.ports:
            assert f":{port}" not in text and f" {port} " not in text and f"port={port}" not in text, (name, port)
    # a log line per request would carry its time: the edge logs state changes, not requests
    assert len(edge.log.read_text().splitlines()) < 20
