"""A job is a sequence of bounded runs: locks, reruns, windows across runs and drains, on a real broker.

Small populations (a few hundred devices per window; the crowd threshold deletes about 29) of the
app_language example, fixed seeds. Each test builds its own topics and directories.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from pipelines.demo.population import synthesize
from tests.e2e.chain_harness import (
    SPEC_PATH,
    estimate_parts,
    estimate_rows,
    files_under,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    run_inline,
    start_cli,
    start_job,
    subset,
    wait_for,
    wait_job,
)
from transforms.io.kafka.bounded import read_topic
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
SPEC = load_spec(SPEC_PATH)
WINDOW_MS = SPEC.window_seconds * 1000
HOUR_MS = 3_600_000


def test_second_job_on_a_locked_state_dir_exits_5(broker, tmp_path) -> None:
    chain = new_chain(broker.bootstrap, tmp_path, "lock")
    produce(chain, synthesize(SPEC, 300, start_ms=recent_start(WINDOW_MS), seed=11))
    run_inline(chain, ("encode",))
    first = start_job(chain, "shuffle")
    staging = chain.state("shuffle") / "staging"
    wait_for(lambda: staging.is_dir() and any(staging.iterdir()), what="the first shuffle run to start")
    os.kill(first.pid, signal.SIGSTOP)  # it holds the lock, mid-run, for as long as the second job needs
    try:
        second = start_cli(chain, "shuffle")
        _, err = second.communicate(timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 5, err
    assert "another esa job" in err and "holds" in err and "--state_dir" in err
    done = wait_job(first)
    assert done.returncode == 0, done.stderr[-2000:]
    parts = done.summary["parts"]
    assert parts["released"] + parts["deleted"] == 300
    (entry,) = ledger_entries(chain, "shuffle")
    assert entry.published and entry.n_sets == parts["released"]
    keys = [r.key.decode() for r in read_topic(broker.bootstrap, chain.shuffled)]
    assert keys and len(keys) == len(set(keys)) == entry.batches
    assert all(k.startswith(f"{entry.release_id}:") for k in keys)


def test_reruns_append_and_never_replace(broker, tmp_path) -> None:
    start = recent_start(WINDOW_MS, back=4)
    chain = new_chain(broker.bootstrap, tmp_path, "rerun")
    produce(chain, synthesize(SPEC, 300, start_ms=start, seed=12), bad_per_kind=1)
    first = run_inline(chain)
    assert all(s.balanced for s in first.values())
    dead_dirs = (chain.state("encode") / "dead_letters", chain.state("shuffle") / "dead_letters",
                 chain.out / "dead_letters")
    estimates = files_under(chain.out / "estimates")
    dead = [files_under(d) for d in dead_dirs]
    assert len(estimates) == 1 and dead[0] and dead[1]  # bad raw events; bad reports and the duplicate

    # Nothing new: the CLI run exits 0 and writes nothing anywhere.
    idle = start_cli(chain, "run")
    _, err = idle.communicate(timeout=180)
    assert idle.returncode == 0, err
    assert files_under(chain.out / "estimates") == estimates
    assert [files_under(d) for d in dead_dirs] == dead

    # A new window (and new bad records): a new part and new dead-letter files; the old ones untouched.
    produce(chain, synthesize(SPEC, 300, start_ms=start + WINDOW_MS, seed=13), bad_per_kind=1)
    second = run_inline(chain)
    assert second["shuffle"].parts["dead_lettered"] == first["shuffle"].parts["dead_lettered"]
    after = files_under(chain.out / "estimates")
    assert len(after) == 2 and {k: after[k] for k in estimates} == estimates
    for directory, old in zip(dead_dirs, dead, strict=True):
        new = files_under(directory)
        assert {k: new[k] for k in old} == old
        letters = [k for k in new if k.endswith(".avro")]
        assert len(letters) == len([k for k in old if k.endswith(".avro")]) + (1 if old else 0)
    assert sorted(estimate_parts(chain)) == [start + WINDOW_MS, start + 2 * WINDOW_MS]


def test_window_spanning_two_runs_is_released_once_when_closed(broker, tmp_path) -> None:
    """Half the window, run (open: held), the other half and a day's worth of event time, run (released)."""
    begin = recent_start(WINDOW_MS, back=30)
    end = begin + WINDOW_MS
    population = synthesize(SPEC, 300, start_ms=begin, seed=14)
    later = synthesize(SPEC, 30, start_ms=begin + 26 * HOUR_MS, seed=15)  # event time past end + lateness
    chain = new_chain(broker.bootstrap, tmp_path, "span", drain=False)
    produce(chain, subset(population, np.arange(150)))
    first = run_inline(chain.at(now_ms=end + 600_000))
    assert first["shuffle"].parts["held"] == 150 and first["shuffle"].parts["released"] == 0
    assert first["shuffle"].balanced and ledger_entries(chain, "shuffle") == [] and estimate_parts(chain) == {}

    produce(chain, subset(population, np.arange(150, 300)))
    produce(chain, later)
    second = run_inline(chain.at(now_ms=begin + 28 * HOUR_MS))
    shuffled = second["shuffle"]
    assert shuffled.balanced and shuffled.parts["held"] == 30  # the later window is open in its turn
    assert shuffled.count("kafka_records_read") == 150 + 150 + 30  # the held half is read again
    assert shuffled.parts["released"] + shuffled.parts["deleted"] == 300
    (entry,) = ledger_entries(chain, "shuffle")
    assert entry.key.window_end_ms == end and entry.n_sets == shuffled.parts["released"]
    assert {w: len(p) for w, p in estimate_parts(chain).items()} == {end: 1}
    assert {n for w, _, _, _, n, _ in estimate_rows(chain)} == {shuffled.parts["released"]}


def test_drain_releases_open_windows_and_later_events_are_late(broker, tmp_path) -> None:
    start = recent_start(WINDOW_MS, back=2)  # inside the allowed lateness: open without a drain
    population = synthesize(SPEC, 320, start_ms=start, seed=16)
    chain = new_chain(broker.bootstrap, tmp_path, "drain", drain=False)
    produce(chain, subset(population, np.arange(300)))
    held = run_inline(chain, ("encode", "shuffle"))["shuffle"]
    assert held.parts["held"] == 300 and ledger_entries(chain, "shuffle") == []
    drained = run_inline(chain.at(drain=True), ("shuffle", "analyze"))
    assert drained["shuffle"].parts["released"] + drained["shuffle"].parts["deleted"] == 300
    assert len(ledger_entries(chain, "shuffle")) == 1 and len(estimate_parts(chain)) == 1
    rows = estimate_rows(chain)

    produce(chain, subset(population, np.arange(300, 320)))  # new devices, same window: too late now
    late = run_inline(chain)
    assert late["shuffle"].balanced and late["shuffle"].count("sets_late") == 20
    assert late["shuffle"].parts["dead_lettered"] == 20 and late["shuffle"].parts["held"] == 0
    assert late["analyze"].count("kafka_records_read") == 0
    assert len(ledger_entries(chain, "shuffle")) == 1 and estimate_rows(chain) == rows
