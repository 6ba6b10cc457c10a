"""Ctrl-C and SIGTERM during ``esa demo``, as a terminal and a process manager send them: a real ``esa demo``
process in its own process group (its embedded Kafka broker in it too), the signal sent to the whole group at
three points (broker starting, encoder running, shuffler running). Each stops with one line, exit 130
(SIGINT) or 143 (SIGTERM), no traceback and no process left; the same ``--out`` then runs to the end.

Before: exit 1, ~200 lines with three tracebacks (Beam re-raises the KeyboardInterrupt wrapped), and the
``--out`` refused as "sealed" although nothing was released."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
CLIENTS = "2000"
DEADLINE_S = 600  # the marker must show up within this (a loaded 2-core machine); no timing is asserted


def _start(out: Path, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "demo", "--clients", CLIENTS, "--out", str(out)],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def _java_child(proc: subprocess.Popen[str]) -> bool:
    """The embedded broker's JVM has been started (and so the demo is inside the broker's start-up)."""
    for child in _children(proc.pid):
        try:
            if b"java" in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _interrupt_at(proc: subprocess.Popen[str], marker: str | None, sig: int) -> tuple[list[str], list[str]]:
    """Read the demo's output until ``marker`` (None: until its broker JVM exists), signal its process group,
    and return (the lines before, the lines after)."""
    before: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    if marker is None:
        while not _java_child(proc):
            assert proc.poll() is None and time.monotonic() < deadline, "the demo never started its broker"
            time.sleep(0.05)
    else:
        assert proc.stdout is not None
        for line in proc.stdout:
            before.append(line.rstrip("\n"))
            if marker in line:
                break
        else:
            pytest.fail(f"the demo ended before {marker!r}:\n" + "\n".join(before[-30:]))
    os.killpg(proc.pid, sig)
    out, _ = proc.communicate(timeout=DEADLINE_S)
    return before, out.splitlines()


def _group_gone(pgid: int) -> bool:
    """No process of the demo's group is left (its broker JVM included), allowing a few seconds to exit."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _assert_one_line_stop(proc: subprocess.Popen[str], after: list[str], sig: int) -> None:
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, "\n".join(after[-60:])
    assert after[-1] == f"esa demo: interrupted by {name}; stopped (exit {128 + sig})", after[-20:]
    # What may precede it: progress already on its way (a heartbeat, a job's INFO line), nothing else.
    others = [ln for ln in after[:-1] if not (ln.startswith("  ") or " INFO " in ln)]
    assert others == [] and "Traceback" not in "\n".join(after), after[-60:]
    assert _group_gone(proc.pid), "a process of the demo's group outlived it"


@pytest.mark.parametrize(("marker", "sig"), [
    (None, signal.SIGINT),                                  # during the broker's start
    ("records planned from telemetry", signal.SIGINT),      # the encoder's pipeline is running
    ("records planned from reports", signal.SIGTERM),       # the shuffler's pipeline is running
], ids=["broker-start-SIGINT", "encode-SIGINT", "shuffle-SIGTERM"])
def test_a_signal_stops_the_demo_in_one_line(marker: str | None, sig: int, tmp_path: Path) -> None:
    proc = _start(tmp_path / "demo", tmp_path)
    try:
        _, after = _interrupt_at(proc, marker, sig)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _assert_one_line_stop(proc, after, sig)


def test_an_interrupted_out_is_used_again(tmp_path: Path) -> None:
    """Ctrl-C while the encoder runs (nothing sealed yet), then the same command runs to the end."""
    out = tmp_path / "demo"
    proc = _start(out, tmp_path)
    try:
        _, after = _interrupt_at(proc, "records planned from telemetry", signal.SIGINT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _assert_one_line_stop(proc, after, signal.SIGINT)
    assert not (out / "summary.json").exists()
    again = _start(out, tmp_path)
    text, _ = again.communicate(timeout=DEADLINE_S)
    assert again.returncode == 0, text[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting_balanced"] is True and summary["n_clients"] > 0, summary
