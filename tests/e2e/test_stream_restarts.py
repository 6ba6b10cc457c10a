"""The streaming shuffler's driver killed (SIGKILL) while its release agent works, then restarted: every window
is released once, identical to the bounded ``--drain`` shuffler's release, and the estimates are the same.

The kill comes right after the first release was published and before the ledger marked it published (the
worst point for a duplicate): the restarted driver republishes it byte for byte (the same keys: a no-op for
the analyzer and for a compacted topic), finds the releases the first driver left staged, seals what was not
sealed and never seals a window twice.
"""

from __future__ import annotations

import json

import pytest

from pipelines import analyze
from tests.e2e.chain_harness import (
    _env,
    bounded_reference,
    cli_argv,
    estimate_rows,
    ledger_entries,
    stream_twin,
)

pytestmark = pytest.mark.slow
N, WINDOWS = 800, 2


def test_driver_killed_after_publishing_then_restarted_releases_each_window_once(broker, tmp_path) -> None:
    import subprocess

    bounded, _ = bounded_reference(broker.bootstrap, tmp_path, N, WINDOWS, seed=31)
    stream = stream_twin(bounded, tmp_path / "sdf")
    argv = cli_argv(stream, "shuffle", "--kafka_io", "sdf", "--stop_after_idle_seconds", "2")

    killed = subprocess.run(argv, env=_env("shuffle:after_publish"), capture_output=True, text=True, timeout=180)
    assert killed.returncode == -9, killed.stderr[-3000:]
    sealed = ledger_entries(stream, "shuffle")
    assert len(sealed) == 1 and sealed[0].status == "sealed"  # published, not yet marked: the crash window

    again = subprocess.run(argv, env=_env(None), capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "republished 1 release(s)" in again.stderr
    summary = json.loads([line for line in again.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["balanced"] and summary["accounting"]["read"] == 0  # the first driver's source committed all
    entries = ledger_entries(stream, "shuffle")
    assert [(e.key, e.digest, e.status) for e in entries] == \
        [(e.key, e.digest, "published") for e in ledger_entries(bounded, "shuffle")]
    assert not list((stream.state("shuffle") / "staging" / "stream" / "releases").iterdir())

    analyzed = analyze.run(stream.config("analyze"))
    assert analyzed.balanced
    assert estimate_rows(stream) == estimate_rows(bounded)
