"""A broker that cannot start says why in one line, and `esa broker` exits 4 (the broker-unreachable code).

Each cause is real: a port another process listens on, a PATH without Java, a PATH without Maven and a
Maven that is offline (``-o`` from a ``.mvn/maven.config`` beside the fetch) with an empty jar cache.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.broker import BrokerError, LocalBroker, kafka_jars
from pipelines.broker.jars import java_binary


def _path_without(*tools: str, tmp_path: Path) -> str:
    """A PATH of symlinks to every tool this test needs except ``tools``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("java", "mvn", "python3"):
        found = shutil.which(name)
        if found and name not in tools:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


def test_a_taken_port_is_named(broker: LocalBroker) -> None:
    with pytest.raises(BrokerError, match=rf"port {broker.port} on 127.0.0.1 is already in use"):
        LocalBroker(port=broker.port).start()


def test_missing_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_without("java", tmp_path=tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match="Java is not installed"):
        java_binary()


def test_missing_maven_with_an_empty_cache_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_without("mvn", tmp_path=tmp_path))
    with pytest.raises(BrokerError, match=r"Maven \(`mvn`\) is not on PATH"):
        kafka_jars(root=tmp_path / "cache")


def test_an_offline_maven_with_an_empty_cache_is_named(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / ".mvn").mkdir(parents=True)
    (root / ".mvn" / "maven.config").write_text(f"-o\n-Dmaven.repo.local={tmp_path / 'empty-repo'}\n")
    with pytest.raises(BrokerError, match=r"mvn could not fetch Apache Kafka .* nothing is cached yet\): \S"):
        kafka_jars(root=root)
    assert not any(p.name.startswith("kafka-") and p.is_dir() for p in root.iterdir())  # no half cache


def test_esa_broker_exits_4_with_one_line(broker: LocalBroker) -> None:
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "broker", "--port", str(broker.port)],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 4 and done.stdout == ""
    assert done.stderr.strip() == f"esa broker: port {broker.port} on 127.0.0.1 is already in use"


def test_later_starts_do_not_fetch(broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once cached, a start needs neither Maven nor the network: here it runs with no `mvn` on PATH."""
    monkeypatch.setenv("PATH", _path_without("mvn", tmp_path=tmp_path))
    with LocalBroker() as local, socket.create_connection(("127.0.0.1", local.port), timeout=5):
        assert local.running


def test_the_broker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A demo or test killed with SIGKILL (no atexit, no finally) leaves no Kafka JVM behind."""
    code = ("import sys; from pipelines.broker import LocalBroker; b = LocalBroker().start(); "
            "print(b.pid, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    broker_pid = int(parent.stdout.readline())
    os.kill(parent.pid, 9)
    parent.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(broker_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(broker_pid, 9)
    pytest.fail("the broker outlived the process that started it")


def test_a_broker_started_from_a_worker_thread_outlives_that_thread() -> None:
    """Linux sends the parent-death signal when the forking *thread* ends: the raw hook kills a child started
    from a finished worker thread (what stopped a restarted test broker 2 s after it joined); the hook the
    brokers use does not. A ``sleep`` stands in for the JVM: the signal is the kernel's, not Kafka's."""
    import threading

    from pipelines.broker.local import _terminate_with_parent, parent_death_hook

    def started_from_a_thread(hook: Callable[[], Callable[[], None] | None]) -> subprocess.Popen[bytes]:
        box: list[subprocess.Popen[bytes]] = []
        worker = threading.Thread(target=lambda: box.append(subprocess.Popen(["sleep", "60"], preexec_fn=hook())))
        worker.start()
        worker.join()
        return box[0]

    raw, guarded = started_from_a_thread(lambda: _terminate_with_parent), started_from_a_thread(parent_death_hook)
    try:
        assert raw.wait(timeout=30) == -15  # SIGTERM
        time.sleep(0.5)
        assert guarded.poll() is None
        assert parent_death_hook() is _terminate_with_parent  # the main thread keeps the protection
    finally:
        for child in (raw, guarded):
            child.kill()
            child.wait()
