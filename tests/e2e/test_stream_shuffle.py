"""``esa shuffle --kafka_io sdf`` on the FnApiRunner against a real broker: the streaming shuffler releases
what the bounded ``--drain`` shuffler releases (identical estimates), once per window ever; clients re-sent
for a released window are late; a window a bounded run sealed is never released again by the stream."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines import analyze, shuffle
from pipelines.demo.population import synthesize
from pipelines.job_config import JobConfig
from tests.e2e.chain_harness import (
    SPEC_PATH,
    bounded_reference,
    estimate_rows,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    stream_twin,
    topic_records,
)
from transforms.io.kafka.bounded import produce_records, read_topic
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
N, WINDOWS, IDLE_S = 1500, 2, 2.0


def streaming(config: JobConfig, **changes: object) -> JobConfig:
    return replace(config, kafka_io="sdf", stop_after_idle_seconds=IDLE_S, **changes)


@pytest.fixture(scope="module")
def chains(broker, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One population encoded once; shuffled by the bounded --drain job (``bounded``) and by the streaming job
    (``stream``, its own state, group and shuffled topic); each analyzed by the bounded analyzer."""
    base = tmp_path_factory.mktemp("stream")
    bounded, first = bounded_reference(broker.bootstrap, base, N, WINDOWS, seed=11, bad_per_kind=1)
    stream = stream_twin(bounded, base / "sdf")
    summary = shuffle.run(streaming(stream.config("shuffle")))
    analyzed = analyze.run(stream.config("analyze"))
    return {"bounded": bounded, "stream": stream, "summary": summary, "analyzed": analyzed,
            "bounded_shuffle": first["shuffle"]}


def test_streaming_shuffle_equals_the_bounded_drain(chains: dict) -> None:
    summary = chains["summary"]
    assert summary.balanced, summary.accounting
    assert summary.extra["releases"] == WINDOWS and summary.extra["conflicts"] == 0
    assert summary.count("sets_late") == 0
    rows = estimate_rows(chains["stream"])
    assert rows and rows == estimate_rows(chains["bounded"])
    assert [e.digest for e in ledger_entries(chains["stream"], "shuffle")] == \
        [e.digest for e in ledger_entries(chains["bounded"], "shuffle")]  # byte-identical releases
    assert summary.parts["dead_lettered"] > 0  # the injected bad records, kept in the stage's own domain
    assert list((chains["stream"].state("shuffle") / "dead_letters").glob("dead-letters-stream-*.avro"))
    assert not list((chains["stream"].state("shuffle") / "staging" / "stream" / "releases").iterdir())


def test_resent_clients_are_late_and_nothing_is_released_twice(chains: dict, broker) -> None:
    stream = chains["stream"]
    before, shuffled_before = estimate_rows(stream), topic_records(broker.bootstrap, stream.shuffled)
    resent = [r.value for r in read_topic(broker.bootstrap, stream.reports)]
    produce_records(broker.bootstrap, stream.reports, resent)  # byte-identical copies, after the release
    again = shuffle.run(streaming(stream.config("shuffle")))
    assert again.balanced, again.accounting
    assert again.count("kafka_records_read") == len(resent)  # only the new records: the rest was committed
    assert again.extra["releases"] == 0
    authenticated = chains["summary"].count("sets_authenticated")
    assert again.count("sets_late") == authenticated  # every set of a released window: late, dead-lettered
    assert len(ledger_entries(stream, "shuffle")) == WINDOWS
    assert topic_records(broker.bootstrap, stream.shuffled) == shuffled_before
    assert analyze.run(stream.config("analyze")).count("kafka_records_read") == 0
    assert estimate_rows(stream) == before


def test_a_window_sealed_by_a_bounded_run_is_not_released_by_the_stream(chains: dict, broker) -> None:
    bounded = chains["bounded"]
    entries = ledger_entries(bounded, "shuffle")
    shuffled_before = topic_records(broker.bootstrap, bounded.shuffled)
    # The bounded job's own state (and ledger), a fresh group: the stream reads every record again.
    config = streaming(bounded.config("shuffle"), group_id=f"{bounded.group}-fresh")
    again = shuffle.run(config)
    assert again.balanced, again.accounting
    assert again.extra["releases"] == 0 and again.extra["conflicts"] == 0
    # What the bounded run read is a re-read (part of its releases, or dead-lettered by it already); anything
    # newer on the topic (the previous test's re-sent copies, if it ran) is dead-lettered, never released.
    read_by_bounded = chains["bounded_shuffle"].count("kafka_records_read")
    assert again.count("records_reread") == read_by_bounded
    assert again.parts["dead_lettered"] == again.count("kafka_records_read") - read_by_bounded
    assert again.parts["released"] == 0 and again.parts["deleted"] == 0
    assert ledger_entries(bounded, "shuffle") == entries
    assert topic_records(broker.bootstrap, bounded.shuffled) == shuffled_before


def test_esa_run_chains_the_streaming_shuffle_from_the_command_line(broker, tmp_path) -> None:
    """``esa run --kafka_io sdf --stop_after_idle_seconds S``: bounded encode, streaming shuffle, bounded analyze,
    as one command; the local runner without an idle stop is refused with the fix (exit 3)."""
    import json
    import subprocess

    from tests.e2e.chain_harness import _env, cli_argv

    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "cli")
    produce(chain, synthesize(spec, 400, start_ms=recent_start(spec.window_seconds * 1000, back=3), seed=3))
    refused = subprocess.run(cli_argv(chain, "shuffle", "--kafka_io", "sdf"), env=_env(None), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 3 and "--stop_after_idle_seconds" in refused.stderr
    done = subprocess.run(cli_argv(chain, "run", "--kafka_io", "sdf", "--stop_after_idle_seconds", str(IDLE_S)),
                          env=_env(None), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["balanced"] and summary["accounting"]["shuffle"]["read"] == 400
    assert len(estimate_rows(chain)) == spec.d  # one window released and analyzed


def test_a_second_streaming_shuffler_beside_the_first_is_refused(broker, tmp_path) -> None:
    """Two drivers on one state directory: the second exits 5 (state locked) while the first holds it, and
    the first still releases its window once."""
    import json
    import subprocess

    from tests.e2e.chain_harness import _env, cli_argv, run_inline, wait_for

    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "twin")
    produce(chain, synthesize(spec, 300, start_ms=recent_start(spec.window_seconds * 1000, back=3), seed=5))
    run_inline(chain, ("encode",))
    argv = cli_argv(chain, "shuffle", "--kafka_io", "sdf", "--stop_after_idle_seconds", "6")
    first = subprocess.Popen(argv, env=_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = chain.state("shuffle") / "LOCK"

        def held_by_first() -> bool:
            text = lock.read_text(encoding="utf-8") if lock.exists() else ""
            return bool(text.strip()) and json.loads(text)["pid"] == first.pid

        wait_for(held_by_first, timeout=60, what="the first driver holding the state lock")
        second = subprocess.run(argv, env=_env(None), capture_output=True, text=True, timeout=120)
        assert second.returncode == 5, second.stderr[-3000:]
        assert f"another esa job (pid {first.pid} on" in second.stderr
        _, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, err[-3000:]
    entries = ledger_entries(chain, "shuffle")
    assert len(entries) == 1 and entries[0].status == "published"
