"""The service loop and the broker under restarts: ``esa run --follow`` stops cleanly on SIGTERM, and a
durable broker restarted in the middle of a run loses nothing and releases nothing twice."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from pipelines.broker import LocalBroker
from pipelines.demo.population import synthesize
from tests.e2e.chain_harness import (
    SPEC_PATH,
    estimate_parts,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    run_inline,
    start_cli,
    start_job,
    subset,
    topic_records,
    wait_for,
    wait_job,
)
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
SPEC = load_spec(SPEC_PATH)
WINDOW_MS = SPEC.window_seconds * 1000


def produce_in_one_transaction(chain, population) -> None:
    """A window's events appear to the encoder at once (it reads committed records only): produced one by one,
    a --drain run could start between two of them and close the window on part of its events."""
    from confluent_kafka import Producer

    from pipelines.demo.simulate import telemetry_messages
    from pipelines.enrolment import enrol_simulated

    enrol_simulated(chain.keys, population.client_ids.tolist())
    producer = Producer({"bootstrap.servers": chain.bootstrap, "transactional.id": f"{chain.raw}-second-window"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, value in telemetry_messages(SPEC, population):
        producer.produce(chain.raw, value, key)
    producer.commit_transaction(30)


def test_follow_releases_as_events_arrive_and_stops_on_sigterm(broker, tmp_path) -> None:
    start = recent_start(WINDOW_MS, back=4)
    population = synthesize(SPEC, 400, windows=2, start_ms=start, seed=17)
    first = population.event_times_ms < start + WINDOW_MS
    chain = new_chain(broker.bootstrap, tmp_path, "follow")  # --drain: each run closes what it has read
    produce(chain, subset(population, np.flatnonzero(first)))
    proc = start_cli(chain, "run", "--follow", "--poll_seconds", "1")
    try:
        wait_for(lambda: start + WINDOW_MS in estimate_parts(chain), timeout=240, what="the first window's estimates")
        produce_in_one_transaction(chain, subset(population, np.flatnonzero(~first)))
        wait_for(lambda: len(estimate_parts(chain)) == 2, timeout=240, what="the second window's estimates")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    runs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(runs) >= 2 and all(r["balanced"] for r in runs)
    for stage in ("encode", "shuffle", "analyze"):
        state = json.loads((chain.state(stage) / "run_state.json").read_text())
        # every run, the last one included, saved its state; a run skipped for having nothing to do saves none
        assert state["runs"] == sum(stage not in r.get("skipped", []) for r in runs), stage
    assert {w: len(p) for w, p in estimate_parts(chain).items()} == {start + WINDOW_MS: 1, start + 2 * WINDOW_MS: 1}
    again = run_inline(chain)
    assert [again[s].count("kafka_records_read") for s in ("encode", "shuffle", "analyze")] == [0, 0, 0]


def test_durable_broker_restarted_mid_run(tmp_path) -> None:
    durable = LocalBroker(data_dir=tmp_path / "broker").start()
    try:
        chain = new_chain(durable.bootstrap, tmp_path, "durable")
        produce(chain, synthesize(SPEC, 300, start_ms=recent_start(WINDOW_MS), seed=18))
        run_inline(chain, ("encode",))
        proc = start_job(chain, "shuffle")
        staging = chain.state("shuffle") / "staging"
        wait_for(lambda: staging.is_dir() and any(staging.iterdir()), what="the shuffle run to start")
        durable.kill()  # SIGKILL: the broker dies under the running job ...
        durable.restart()  # ... and comes back on the same port and data
        interrupted = wait_job(proc, timeout=300)
        assert topic_records(durable.bootstrap, chain.reports) == 300  # nothing lost by the restart
        completed = [interrupted.summary] if interrupted.returncode == 0 else []
        after = run_inline(chain, ("shuffle", "analyze"))
        completed.append({"parts": after["shuffle"].parts})
        assert after["shuffle"].balanced and after["analyze"].balanced
        assert sum(c["parts"]["released"] + c["parts"]["deleted"] for c in completed) == 300
        (entry,) = ledger_entries(chain, "shuffle")
        assert entry.published and sum(c["parts"]["released"] for c in completed) == entry.n_sets
        assert {w: len(p) for w, p in estimate_parts(chain).items()} == {entry.key.window_end_ms: 1}
    finally:
        durable.stop()
