"""The budget survives kill -9 and concurrent processes: reports that left a device never exceed what its
ledger says was spent, and the ledger never exceeds the limit."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.device.helpers import histogram_spec, open_report
from transforms.privacy.composition import fragment_epsilon

ROOT = Path(__file__).resolve().parents[2]
SPECS = {"grr": ("grr", 0.5, {}), "rf": ("rappor_fragments", 4.0, {"d": 8, "fragments": 2, "epsilon_fragment": 1.0}),
         # eps_f = 15: every fragment copies the backstop (flip probability 3e-7), so a report shows which one it used
         "copy": ("rappor_fragments", 1.0, {"d": 8, "fragments": 2, "epsilon_fragment": 15.0})}
WORKER = """
import os, sys
from tests.device.helpers import T0, client_kwargs, histogram_spec
from tests.device.test_durability import SPECS
from transforms.device import Budget, BudgetExceeded, Client

state, kind, limit, out = sys.argv[1:5]
name, eps, params = SPECS[kind]
budget = Budget(float(limit)) if float(limit) > 0 else None
client = Client(histogram_spec(name, eps, **params), state, budget=budget, clock=lambda: T0, **client_kwargs())
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
print("ready", flush=True)
sys.stdin.readline()  # "go": the parent starts its workers at the same instant
for i in range(10**9 if budget else 96):
    value = 1 if budget else i % 8
    try:
        data = client.encode(value)
    except BudgetExceeded:
        break
    os.write(fd, f"{value}:{data.hex()}\\n".encode())  # one write per report: a kill leaves at most one partial line
    os.fsync(fd)
"""


def _start(tmp_path: Path, kind: str, limit: float, out: Path) -> subprocess.Popen[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "state"), kind, str(limit), str(out)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _go(*procs: subprocess.Popen[str]) -> None:
    """Wait until every worker has imported everything and opened its client, then release them together."""
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _emitted(*outs: Path) -> list[tuple[int, bytes]]:
    """Every (value, report) written; a trailing partial line counts as emitted (the conservative reading)."""
    reports: list[tuple[int, bytes]] = []
    for out in outs:
        for line in out.read_text().split("\n") if out.exists() else []:
            value, _, hexed = line.partition(":")
            if line:
                reports.append((int(value or -1), bytes.fromhex(hexed) if len(hexed) % 2 == 0 else b""))
    return reports


def _spent(tmp_path: Path) -> float:
    path = tmp_path / "state" / "budget.json"
    return json.loads(path.read_text())["spent"] if path.exists() else 0.0


def test_kill_9_in_a_loop_of_encodes_never_overspends(tmp_path):
    limit, cost = 200.0, 0.5  # 400 reports at ~4 ms each (two fsyncs per spend)
    out = tmp_path / "reports.txt"
    rnd = random.Random(7)
    kills = 0
    for _ in range(10):
        proc = _start(tmp_path, "grr", limit, out)
        _go(proc)
        time.sleep(rnd.uniform(0.02, 0.3))
        if proc.poll() is None:
            proc.kill()  # SIGKILL: no cleanup, no atexit, no flush
            kills += 1
        proc.wait()
        spent = _spent(tmp_path)  # parses: the ledger is never torn
        assert len(_emitted(out)) * cost <= spent <= limit
    assert kills >= 5
    proc = _start(tmp_path, "grr", limit, out)  # now run to exhaustion
    _go(proc)
    assert proc.wait(timeout=120) == 0
    assert _spent(tmp_path) == limit and len(_emitted(out)) * cost <= limit


@pytest.mark.parametrize("kind", ["grr", "rf"])
def test_two_processes_sharing_a_state_dir_never_overspend(tmp_path, kind):
    if kind == "grr":
        limit, expected = 60.0, 120
    else:  # the k-th report of a value costs 2 (eps(2k) - eps(2k - 2)) (replacement): the largest k with
        limit = 7.98  # 2 eps(2k) <= limit fits
        expected = sum(2 * fragment_epsilon(4.0, 1.0, 2 * k) <= limit * (1 + 1e-9) for k in range(1, 100))
        assert expected == 4
    outs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    procs = [_start(tmp_path, kind, limit, out) for out in outs]
    _go(*procs)
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(_emitted(*outs)) == expected and _spent(tmp_path) <= limit * (1 + 1e-9)


def test_two_processes_drawing_backstops_together_agree_on_one_per_value(tmp_path):
    name, eps, params = SPECS["copy"]
    spec = histogram_spec(name, eps, **params)
    outs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    procs = [_start(tmp_path, "copy", 0.0, out) for out in outs]
    _go(*procs)
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    memo = next((tmp_path / "state" / "memo").glob("*.json"))
    backstops = json.loads(memo.read_text())["backstops"]
    assert sorted(backstops) == [str(v) for v in range(8)]
    assert len({tuple(b) for b in backstops.values()}) > 1  # eps_b = 1: backstops differ, so a mix-up would show
    reports = _emitted(*outs)
    assert len(reports) == 192
    for value, data in reports:
        _, rows = open_report(spec, data)
        channels = np.array([row[0] for row in rows[1:]])
        for fragment in range(2):
            assert sorted(channels[channels // 8 == fragment] % 8) == backstops[str(value)]
