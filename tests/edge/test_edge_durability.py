"""Nothing acknowledged is lost: SIGKILL the edge under load, and the broker under load (then the edge too, with
reports only in its spool); afterwards every report that got a 202 is in the reports topic, and the only
duplicates are byte-identical copies, which the shuffler counts as duplicates (never a dead letter, never a
second set)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from pipelines.broker import LocalBroker
from pipelines.edge.client import EdgeClient
from tests.edge.harness import EdgeProcess, topic_records, wait_for
from tests.transforms.release_inputs import WIN_A, Devices, make_spec, shuffle_run
from transforms.io.kafka.bounded import ensure_topics

pytestmark = pytest.mark.slow
SPEC = make_spec("grr", size=8, quota=1, min_clients=10)


class Load:
    """Threads posting distinct reports until told to stop or the edge goes away; remembers every 202."""

    def __init__(self, url: str, bodies: list[bytes], threads: int = 4) -> None:
        self.acked: list[bytes] = []
        self.refused: Counter[int] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._post, args=(url, bodies[i::threads]), daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def _post(self, url: str, bodies: list[bytes]) -> None:
        client = EdgeClient(url, timeout_s=30)
        for body in bodies:
            if self._stop.is_set():
                break
            try:
                answer = client.post_report(body)
            except OSError:
                break  # the edge is gone: this body's fate is unknown, and it was never acknowledged
            with self._lock:
                if answer.status == 202:
                    self.acked.append(body)
                else:
                    self.refused[answer.status] += 1
        client.close()

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)


def _check_topic(bootstrap: str, topic: str, acked: list[bytes], devices: Devices, tmp_path: Path) -> int:
    """Every acknowledged report is in the topic, and the shuffler removes exactly the copies; the copies."""
    records = topic_records(bootstrap, topic)
    values = Counter(r.value for r in records)
    missing = [b for b in acked if b not in values]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged reports are not in the topic"
    duplicates = sum(n - 1 for n in values.values())
    run = shuffle_run(tmp_path, [SPEC], devices, records, batch=200)
    assert run.count("dead_lettered") == 0
    assert run.count("sets_duplicate") == duplicates  # every copy is removed by the shuffler's dedupe
    released = sum(p.n_sets for p in run.values("released"))
    assert released + run.count("sets_deleted") == len(values)
    return duplicates


def _bodies(devices: Devices) -> list[bytes]:
    return [r.value for r in devices.crowd(SPEC, devices.clients, WIN_A)]


def test_sigkill_of_the_edge_under_load_loses_no_acknowledged_report(broker, topic_name: str, tmp_path: Path) -> None:
    devices = Devices.enrol(tmp_path / "keys", 1500)
    bodies = _bodies(devices)
    ensure_topics(broker.bootstrap, [topic_name, f"{topic_name}-devices"], partitions=2)
    args = ("--reports_topic", topic_name, "--devices_topic", f"{topic_name}-devices")
    edge = EdgeProcess(broker.bootstrap, devices.keys_dir, tmp_path / "spool", tmp_path / "edge.log", *args).start()
    load = Load(edge.url, bodies)
    wait_for(lambda: load.count() >= 300, what="300 acknowledged reports")
    edge.kill()  # SIGKILL mid-load
    load.stop()
    acked = list(load.acked)
    assert 300 <= len(acked) < len(bodies)
    with EdgeProcess(broker.bootstrap, devices.keys_dir, tmp_path / "spool", tmp_path / "edge.log", *args) as again:
        client = EdgeClient(again.url)
        wait_for(lambda: b'"spool_records": 0' in client.request("GET", "/healthz").body, what="the spool drained")
        assert client.post_report(acked[0]).status == 202  # a device resending after a lost answer: a copy
        client.close()
    duplicates = _check_topic(broker.bootstrap, topic_name, acked, devices, tmp_path)
    assert duplicates >= 1


def test_sigkill_of_the_broker_under_load_then_of_the_edge_loses_nothing(topic_name: str, tmp_path: Path) -> None:
    devices = Devices.enrol(tmp_path / "keys", 1500)
    bodies = _bodies(devices)
    args = ("--reports_topic", topic_name, "--devices_topic", f"{topic_name}-devices", "--ack_timeout_seconds", "1")
    with LocalBroker(data_dir=tmp_path / "kafka") as own:
        ensure_topics(own.bootstrap, [topic_name, f"{topic_name}-devices"], partitions=2)
        edge = EdgeProcess(own.bootstrap, devices.keys_dir, tmp_path / "spool", tmp_path / "edge.log", *args).start()
        load = Load(edge.url, bodies)
        wait_for(lambda: load.count() >= 200, what="200 acknowledged reports")
        own.kill()  # the broker dies under load: the edge keeps acknowledging from its spool
        at_kill = load.count()
        wait_for(lambda: load.count() >= at_kill + 300, timeout_s=180, what="300 reports acknowledged while Kafka "
                 "is down")
        edge.kill()  # and the edge dies too, with reports only in its spool
        load.stop()
        acked = list(load.acked)
        assert not load.refused  # neither 503 nor anything else while the spool had room
        spooled = sum(p.stat().st_size for p in (tmp_path / "spool").glob("*.seg"))
        assert spooled > 0
        own.restart()
        started = time.monotonic()
        with EdgeProcess(own.bootstrap, devices.keys_dir, tmp_path / "spool", tmp_path / "edge.log", *args) as again:
            client = EdgeClient(again.url)
            wait_for(lambda: b'"spool_records": 0' in client.request("GET", "/healthz").body, timeout_s=180,
                     what="the spool drained")
            client.close()
        assert time.monotonic() - started < 600
        _check_topic(own.bootstrap, topic_name, acked, devices, tmp_path)
