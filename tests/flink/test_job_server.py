"""The Flink job server assembled from Maven (``pipelines.flink_job_server``): it listens on loopback only,
and no JVM outlives its owner, however the owner dies (SIGKILL of the submitting process, SIGKILL of the
watchdog between them). Real processes, real signals; the JVM is found by the pid the watchdog reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.flink_job_server import JobServer

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
OWNER = """
import sys, time
from pipelines.flink_job_server import JobServer
server = JobServer("127.0.0.1:1", sys.argv[1])
print(server.start(), server.jvm_pid, server.watchdog_pid, flush=True)
time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still alive {timeout_s:.0f} s later"
        time.sleep(0.2)


def _listening(pid: int) -> set[str]:
    """``ADDRESS:PORT`` of every TCP socket of ``pid`` in LISTEN state (from /proc, no ss/netstat needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                assert len(address) == width
                found.add(f"{_address(address)}:{int(port, 16)}")
    return found


def _address(hexed: str) -> str:
    raw = bytes.fromhex(hexed)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # /proc prints 32-bit words host-endian
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in words[12:])  # an IPv4-mapped IPv6 address
    return words.hex()


def _owner(tmp_path: Path) -> tuple[subprocess.Popen[str], str, int, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env=env)
    assert owner.stdout is not None
    endpoint, jvm, watchdog = owner.stdout.readline().split()
    return owner, endpoint, int(jvm), int(watchdog)


def test_it_listens_on_loopback_only_and_its_jvm_dies_when_the_owner_is_killed(tmp_path: Path) -> None:
    owner, endpoint, jvm, watchdog = _owner(tmp_path)
    try:
        listening = _listening(jvm)
        assert endpoint in listening and endpoint.startswith("127.0.0.1:")
        assert len(listening) == 2, listening  # the Job API and the artifact service, nothing else
        assert all(a.startswith("127.0.0.1:") for a in listening), listening  # never 0.0.0.0 or ::
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=60)
        _wait_gone(watchdog)  # its stdin reached end of file: it stopped the JVM and exited
        _wait_gone(jvm)
    finally:
        owner.kill()


def test_its_jvm_dies_when_the_watchdog_is_killed(tmp_path: Path) -> None:
    owner, _, jvm, watchdog = _owner(tmp_path)
    try:
        os.kill(watchdog, signal.SIGKILL)
        _wait_gone(jvm, timeout_s=60)  # PR_SET_PDEATHSIG: the kernel kills it with its parent
    finally:
        owner.kill()
        owner.wait(timeout=60)


def test_stop_ends_the_jvm_and_a_dead_jvm_ends_the_watchdog(tmp_path: Path) -> None:
    server = JobServer("127.0.0.1:1", tmp_path / "a")
    server.start()
    jvm = server.jvm_pid
    server.stop()
    assert not _alive(jvm)
    again = JobServer("127.0.0.1:1", tmp_path / "b")
    again.start()
    try:
        os.kill(again.jvm_pid, signal.SIGKILL)
        _wait_gone(again.watchdog_pid, timeout_s=60)
        assert not again.alive()
    finally:
        again.stop()


EXPANSION_OWNER = """
import time
from pipelines.kafka_expansion import ExpansionService
service = ExpansionService()
print(service.start(), service.jvm_pid, service.watchdog_pid, flush=True)
time.sleep(3600)
"""


def test_the_kafkaio_expansion_service_listens_on_loopback_and_dies_with_its_owner() -> None:
    """``--kafka_io xlang``'s expansion service: the same watchdog, the same guarantees."""
    owner = subprocess.Popen([sys.executable, "-c", EXPANSION_OWNER], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert owner.stdout is not None
        endpoint, jvm, watchdog = owner.stdout.readline().split()
        listening = _listening(int(jvm))
        assert listening == {endpoint} and endpoint.startswith("127.0.0.1:"), listening
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=60)
        _wait_gone(int(watchdog))
        _wait_gone(int(jvm))
    finally:
        owner.kill()
        owner.wait(timeout=60)
