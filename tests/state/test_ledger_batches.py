"""Withheld windows sealed in batches: one file per call, create-if-absent per key across both layouts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.state.racing import kill_9_when_ready, race
from transforms.state.files import StateError
from transforms.state.ledger import SEALED, WITHHELD, WITHHELD_DIR, ReleaseEntry, ReleaseKey, ReleaseLedger

SPEC = "flood@0123456789ab"
OTHER = "other@ffffffffffff"


def withheld(key: ReleaseKey, run_key: str = "r0") -> ReleaseEntry:
    return ReleaseEntry(key=key, release_id=f"w-{key.window_end_ms}", digest="withheld", n_sets=0, n_messages=0,
                        batches=0, source_ends={"reports/0": 10}, run_key=run_key, sealed_at_ms=1, status=WITHHELD)


def released(key: ReleaseKey, digest: str = "d0") -> ReleaseEntry:
    return ReleaseEntry(key=key, release_id=f"r-{key.window_end_ms}", digest=digest, n_sets=50, n_messages=50,
                        batches=1, source_ends={"reports/0": 10}, run_key="r0", sealed_at_ms=1)


def batch_files(root: Path) -> list[Path]:
    return sorted(root.glob(f"*/{WITHHELD_DIR}/*.jsonl"))


def test_seal_many_writes_one_file_per_spec_and_reads_back(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    keys = [ReleaseKey(SPEC, None, 3_600_000 * i) for i in range(1, 2001)] + [ReleaseKey(OTHER, "v1", 3_600_000)]
    results = ledger.seal_many(withheld(k) for k in keys)
    assert [created for _, created in results] == [True] * len(keys)
    assert [stored.key for stored, _ in results] == keys
    assert len(batch_files(tmp_path)) == 2  # one per spec, however many windows
    fresh = ReleaseLedger(tmp_path)  # another process: reads the batches from disk
    assert fresh.get(keys[7]) == withheld(keys[7])
    assert {e.key for e in fresh.entries(SPEC)} == set(keys[:-1])
    assert len(list(fresh.entries())) == len(keys)
    assert fresh.unpublished() == []  # withheld windows are never (re)published
    with pytest.raises(StateError, match="withheld, for good"):
        fresh.mark_published(keys[0])


def test_create_if_absent_holds_across_both_layouts(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    done, fresh_key, batched = (ReleaseKey(SPEC, None, 3_600_000 * i) for i in (1, 2, 3))
    assert ledger.seal(released(done)) == (released(done), True)
    assert ledger.seal_many([withheld(batched)]) == [(withheld(batched), True)]
    # A window already released stays released; one already withheld stays withheld; a new one is sealed.
    results = ReleaseLedger(tmp_path).seal_many([withheld(done, "r1"), withheld(fresh_key, "r1"),
                                                 withheld(batched, "r1")])
    assert results == [(released(done), False), (withheld(fresh_key, "r1"), True), (withheld(batched), False)]
    # A later single seal of a batch-withheld window gets the withheld entry back: nothing is released.
    assert ReleaseLedger(tmp_path).seal(released(batched, "late")) == (withheld(batched), False)
    assert not ledger.path_of(batched).exists()
    assert ReleaseLedger(tmp_path).seal_many([withheld(batched)]) == [(withheld(batched), False)]
    assert len(batch_files(tmp_path)) == 2  # nothing new to write: no empty batch file


def test_seal_many_refuses_what_it_cannot_batch(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    key = ReleaseKey(SPEC, None, 3_600_000)
    with pytest.raises(ValueError, match="withheld entries only"):
        ledger.seal_many([released(key)])
    with pytest.raises(ValueError, match="same key twice"):
        ledger.seal_many([withheld(key), withheld(key, "r1")])
    assert list(ledger.entries()) == []


def test_damaged_or_foreign_batches_are_errors_not_absences(tmp_path: Path) -> None:
    ReleaseLedger(tmp_path).seal_many([withheld(ReleaseKey(SPEC, None, 3_600_000 * i)) for i in (1, 2)])
    (path,) = batch_files(tmp_path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    cases = {
        "header says 2 entries": "\n".join(lines[:2]) + "\n",  # truncated
        "version 9": "\n".join([json.dumps({**header, "version": 9}), *lines[1:]]) + "\n",
        "not a withheld batch": "\n".join([json.dumps({"format": "x"}), *lines[1:]]) + "\n",
        "status 'sealed'": "\n".join([lines[0], lines[1].replace('"status": "withheld"', f'"status": "{SEALED}"'),
                                      lines[2]]) + "\n",
    }
    for match, text in cases.items():
        path.write_text(text)
        with pytest.raises(StateError, match=match):
            list(ReleaseLedger(tmp_path).entries())


def _race(me: int, root: Path) -> list[tuple[str, bool]]:
    """Even racers seal windows 1..40 in one batch, odd ones seal each as a release, one at a time."""
    ledger = ReleaseLedger(root)
    keys = [ReleaseKey(SPEC, None, 3_600_000 * i) for i in range(1, 41)]
    if me % 2 == 0:
        results = ledger.seal_many(withheld(k, f"racer{me}") for k in keys)
    else:
        results = [ledger.seal(dataclasses.replace(released(k), run_key=f"racer{me}")) for k in keys]
    return [(stored.run_key, created) for stored, created in results]


def test_one_winner_per_window_among_racing_batch_and_single_sealers(tmp_path: Path) -> None:
    results = race(6, _race, tmp_path)
    ledger = ReleaseLedger(tmp_path)
    for w in range(40):
        winners = [me for me, per in enumerate(results) if per[w][1]]
        assert len(winners) == 1, (w, [per[w] for per in results])
        # every racer was handed the winner's entry, and the ledger holds it exactly once
        assert {per[w][0] for per in results} == {f"racer{winners[0]}"}
        assert ledger.get(ReleaseKey(SPEC, None, 3_600_000 * (w + 1))).run_key == f"racer{winners[0]}"
    assert len(list(ledger.entries())) == 40  # entries() raises if any key were sealed twice


BATCHER = """
    import sys
    from pathlib import Path
    from transforms.state.ledger import WITHHELD, ReleaseEntry, ReleaseKey, ReleaseLedger
    ledger = ReleaseLedger(Path(sys.argv[1]))
    for run in range(10**6):
        ledger.seal_many(ReleaseEntry(key=ReleaseKey("s@0123456789ab", None, 1000 * run + w), release_id=f"w{w}",
                                      digest="withheld", n_sets=0, n_messages=0, batches=0, source_ends={},
                                      run_key=f"run{run}", sealed_at_ms=1, status=WITHHELD) for w in range(500))
        if run == 0:
            print("ready", flush=True)
"""


def test_kill_9_while_batching_leaves_whole_batches(tmp_path: Path) -> None:
    kill_9_when_ready(BATCHER, str(tmp_path), after_s=0.3)
    found = list(ReleaseLedger(tmp_path).entries())  # raises on any partial batch
    runs: dict[str, int] = {}
    for e in found:
        runs[e.run_key] = runs.get(e.run_key, 0) + 1
    assert runs and set(runs.values()) == {500}  # all of a run's windows, or none
    assert sorted(runs) == sorted(f"run{i}" for i in range(len(runs)))  # in order, none lost before the kill
