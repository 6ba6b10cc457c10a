"""The edge's spool: appends are durable before they return, drain in order, and survive SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.edge.spool import Spool, SpoolFullError

BIG = 1 << 40


def _drain(spool: Spool) -> list[bytes]:
    out = []
    while True:
        bodies, cursor = spool.peek(7)
        if not bodies:
            return out
        spool.commit(cursor, len(bodies), sum(map(len, bodies)))
        out += bodies


def test_append_peek_commit_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, BIG, 0)
    bodies = [f"report-{i}".encode() * (i % 5 + 1) for i in range(50)]
    spool.append_many(bodies[:20])
    spool.append_many(bodies[20:])
    assert spool.depth() == (50, sum(map(len, bodies)))
    first, _ = spool.peek(10)
    assert first == bodies[:10]
    spool.close()
    again = Spool(tmp_path, BIG, 0)  # not committed: all still there after a restart
    assert again.depth()[0] == 50
    assert _drain(again) == bodies
    assert again.depth() == (0, 0) and not list(tmp_path.glob("*.seg"))  # drained segments go
    again.append_many([b"later"])
    assert _drain(again) == [b"later"]


def test_a_restart_resumes_at_the_cursor(tmp_path: Path) -> None:
    spool = Spool(tmp_path, BIG, 0)
    spool.append_many([b"a", b"b", b"c", b"d"])
    _, cursor = spool.peek(2)
    spool.commit(cursor, 2, 2)
    spool.close()
    assert _drain(Spool(tmp_path, BIG, 0)) == [b"c", b"d"]


def test_a_torn_tail_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path, BIG, 0)
    spool.append_many([b"one", b"two"])
    spool.close()
    segment = next(tmp_path.glob("*.seg"))
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x00\x09\x00\x00")  # a frame header cut short by a crash
    again = Spool(tmp_path, BIG, 0)
    assert again.depth()[0] == 2
    again.append_many([b"three"])
    assert _drain(again) == [b"one", b"two", b"three"]


def test_full_or_low_disk_refuses_and_writes_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 64, 0)
    spool.append_many([b"x" * 20])
    with pytest.raises(SpoolFullError):
        spool.append_many([b"y" * 40])
    assert spool.depth() == (1, 20)
    low = Spool(tmp_path / "low", BIG, BIG)  # asks for a petabyte free
    with pytest.raises(SpoolFullError):
        low.append_many([b"z"])
    assert low.depth() == (0, 0)


_WRITER = """
import sys
from pipelines.edge.spool import Spool
spool = Spool(sys.argv[1], 1 << 40, 0)
i = 0
while True:
    spool.append_many([b"record-%d" % (i + k) for k in range(3)])
    i += 3
    print(i, flush=True)
"""


def test_every_acknowledged_append_survives_sigkill(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONPATH": "."})
    assert proc.stdout is not None
    acked = 0
    deadline = time.monotonic() + 120
    while acked < 600 and time.monotonic() < deadline:
        acked = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)  # mid-append: the next batch may be torn
    proc.wait()
    drained = _drain(Spool(tmp_path, 1 << 40, 0))
    assert acked >= 600
    assert len(drained) >= acked  # every acknowledged append, maybe one later batch that completed
    assert drained == [b"record-%d" % i for i in range(len(drained))]
