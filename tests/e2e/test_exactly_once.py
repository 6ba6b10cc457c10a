"""Each (spec, window, crowd) is released exactly once, whatever crashes and resends happen.

A real broker and real processes: the jobs run as subprocesses and are SIGKILLed at every named fault
point (``ESA_CRASH_AT``) and once from outside in the middle of the pipeline; then they are rerun without
the fault. A reference chain runs the same input once, uninterrupted. Both chains read the *same* raw
topic (own state, own consumer group, own downstream topics) with the same keys and seed: sealing
ephemerals are derived from the raw record's topic and position, so an identical input log, not an
identical copy on another topic, is what makes the releases byte-identical and the estimates equal.
"""

from __future__ import annotations

import os
import signal

import pytest

from pipelines.demo.population import synthesize
from tests.e2e.chain_harness import (
    SPEC_PATH,
    estimate_parts,
    estimate_rows,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    run_inline,
    run_job,
    start_job,
    topic_records,
    wait_for,
    wait_job,
)
from transforms.io.kafka.bounded import read_topic
from transforms.spec import load_spec
from transforms.state.estimates_store import read_estimates

N = 1200
WINDOWS = 2
SHUFFLE_FAULTS = ("before_pipeline", "after_pipeline", "after_seal", "after_publish", "before_state")
ANALYZE_FAULTS = ("after_pipeline", "after_seal", "after_publish", "before_state")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def crashed(broker, tmp_path_factory: pytest.TempPathFactory):
    """Reference chain once; faulted chain through every crash point; snapshots of what both left."""
    spec = load_spec(SPEC_PATH)
    base = tmp_path_factory.mktemp("exactly")
    ref = new_chain(broker.bootstrap, base, "ref")
    flt = new_chain(broker.bootstrap, base, "flt", raw=ref.raw)
    population = synthesize(spec, N, windows=WINDOWS, start_ms=recent_start(spec.window_seconds * 1000), seed=5)
    produce(ref, population)
    reference = run_inline(ref)

    runs: dict[str, list] = {"encode": [], "shuffle": [], "analyze": []}
    runs["encode"].append(run_job(flt, "encode", "encode:before_state"))
    runs["encode"].append(run_job(flt, "encode"))
    # kill -9 from outside while the shuffle pipeline runs (its run's staging directory exists)
    proc = start_job(flt, "shuffle")
    staging = flt.state("shuffle") / "staging"
    wait_for(lambda: staging.is_dir() and any(staging.iterdir()), what="the shuffle run to start")
    os.kill(proc.pid, signal.SIGKILL)
    external = wait_job(proc)
    for point in SHUFFLE_FAULTS:
        runs["shuffle"].append(run_job(flt, "shuffle", f"shuffle:{point}"))
    runs["shuffle"].append(run_job(flt, "shuffle"))
    for point in ANALYZE_FAULTS:
        runs["analyze"].append(run_job(flt, "analyze", f"analyze:{point}"))
    runs["analyze"].append(run_job(flt, "analyze"))
    snapshot = {
        "rows": estimate_rows(flt), "parts": estimate_parts(flt), "table": read_estimates(flt.out).to_pylist(),
        "shuffle_ledger": ledger_entries(flt, "shuffle"), "analyze_ledger": ledger_entries(flt, "analyze"),
        "reports": topic_records(broker.bootstrap, flt.reports),
        "shuffled_keys": [r.key for r in read_topic(broker.bootstrap, flt.shuffled)],
    }
    ref_snapshot = {"rows": estimate_rows(ref), "table": read_estimates(ref.out).to_pylist(),
                    "shuffle_ledger": ledger_entries(ref, "shuffle"),
                    "shuffled_keys": [r.key for r in read_topic(broker.bootstrap, ref.shuffled)]}
    return {"spec": spec, "population": population, "ref": ref, "flt": flt, "reference": reference,
            "runs": runs, "external": external, "snapshot": snapshot, "ref_snapshot": ref_snapshot}


def test_faulted_chain_gives_the_uninterrupted_estimates(crashed) -> None:
    assert crashed["external"].killed
    rows, ref_rows = crashed["snapshot"]["rows"], crashed["ref_snapshot"]["rows"]
    assert len(ref_rows) == WINDOWS * crashed["spec"].d
    assert rows == ref_rows  # estimate, stderr, n_clients, eps_central of every item of every window
    # every other column too: release ids, the odometer's cumulative epsilon, windows composed
    assert crashed["snapshot"]["table"] == crashed["ref_snapshot"]["table"]


def test_each_window_released_once(crashed) -> None:
    snap, ref = crashed["snapshot"], crashed["ref_snapshot"]
    shuffle_ledger, analyze_ledger = snap["shuffle_ledger"], snap["analyze_ledger"]
    assert len(shuffle_ledger) == len(analyze_ledger) == WINDOWS
    assert all(e.published for e in shuffle_ledger + analyze_ledger)
    # the very same bytes were released as by the uninterrupted run
    assert [(e.key, e.digest) for e in shuffle_ledger] == [(e.key, e.digest) for e in ref["shuffle_ledger"]]
    assert {w: len(p) for w, p in snap["parts"].items()} == {e.key.window_end_ms: 1 for e in shuffle_ledger}
    # republished batches carry the same keys: nothing on the shuffled topic but the reference's releases
    assert set(snap["shuffled_keys"]) == set(ref["shuffled_keys"])


def test_n_clients_is_devices_sent_minus_deleted(crashed) -> None:
    final = crashed["runs"]["shuffle"][-1].summary["parts"]
    reference = crashed["reference"]["shuffle"].parts
    assert final["released"] == reference["released"] and final["deleted"] == reference["deleted"]
    assert final["released"] == N - final["deleted"]
    n_clients = {w: n for w, _, _, _, n, _ in crashed["snapshot"]["rows"]}
    assert sum(n_clients.values()) == final["released"]
    assert n_clients == {e.key.window_end_ms: e.n_sets for e in crashed["snapshot"]["shuffle_ledger"]}


def test_every_record_accounted_for_once(crashed) -> None:
    snap, runs = crashed["snapshot"], crashed["runs"]
    # The encoder died after producing, before saving its state: its rerun re-sent byte-identical sets.
    encoded = [r.summary for r in runs["encode"] if r.summary]
    assert len(encoded) == 1 and encoded[0]["parts"]["encoded"] == N
    assert snap["reports"] == 2 * N
    # No crashed shuffle run saved its state, so the one completed run read every record once more.
    final = runs["shuffle"][-1].summary
    assert final["balanced"]
    parts = final["parts"]
    assert parts["reread"] == 0 and parts["held"] == 0
    assert parts["duplicate"] + parts["deleted"] + parts["released"] == snap["reports"]
    # The resent copies are counted as duplicates, not dead letters: a healthy rerun is healthy (no exit 6).
    assert parts["duplicate"] == N and parts["dead_lettered"] == 0
    assert final["counters"]["kafka_records_read"] == snap["reports"]
    analyzed = runs["analyze"][-1].summary
    assert analyzed["balanced"] and analyzed["parts"]["reread"] == 0 and analyzed["parts"]["held"] == 0
    assert analyzed["parts"]["analyzed"] == crashed["reference"]["analyze"].parts["analyzed"]
    assert analyzed["parts"]["dead_lettered"] == 0
    keys = snap["shuffled_keys"]  # a release republished after a crash arrives twice: one copy is a duplicate
    assert analyzed["parts"]["duplicate"] == len(keys) - len(set(keys))
    assert analyzed["counters"]["kafka_records_read"] == len(snap["shuffled_keys"])


def test_resent_clients_of_a_released_window_are_late(crashed, broker) -> None:
    """The same events produced again after the release: late at the shuffler, no second release."""
    flt, population = crashed["flt"], crashed["population"]
    before = estimate_rows(flt)
    parts_before = {w: [p.read_bytes() for p in ps] for w, ps in estimate_parts(flt).items()}
    produce(crashed["ref"], population)  # the shared raw topic
    again = run_inline(flt)
    shuffled = again["shuffle"]
    assert shuffled.balanced and shuffled.count("sets_late") == N
    assert shuffled.parts["dead_lettered"] == N and shuffled.parts["released"] == 0
    assert again["analyze"].count("kafka_records_read") == 0
    assert estimate_rows(flt) == before
    assert {w: [p.read_bytes() for p in ps] for w, ps in estimate_parts(flt).items()} == parts_before
    assert len(ledger_entries(flt, "shuffle")) == WINDOWS
