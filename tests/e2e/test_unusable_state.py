"""Damaged state stops a job before it reads anything: one line naming the file, exit 8, and the state left
as it was for the operator to inspect (guessing around it could release a window twice). So does a log that
is shorter than the job's state says it has read (a recreated topic)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines import cli
from pipelines.demo.population import synthesize
from pipelines.exit_codes import ExitCode
from tests.e2e.chain_harness import (
    SPEC_PATH,
    cli_argv,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    run_inline,
    wait_for,
)
from transforms.io.kafka.bounded import ensure_topics, produce_records
from transforms.spec import load_spec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("damage", "words"), [
    (b'{"resume": {"rep/0": 5', "corrupt state file"),  # torn or overwritten by something else
    (b'{"resume": {"rep/0": "five"}}', "invalid run state"),  # valid JSON that is not a run state
])
def test_a_damaged_run_state_is_one_line_and_exit_8(broker, tmp_path, capsys, damage: bytes, words: str) -> None:
    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "damaged")
    produce(chain, synthesize(spec, 200, windows=1, start_ms=recent_start(spec.window_seconds * 1000), seed=3))
    run_inline(chain, ("encode",))
    state_file = chain.state("shuffle") / "run_state.json"
    state_file.parent.mkdir(parents=True)
    state_file.write_bytes(damage)

    assert cli.main(cli_argv(chain, "shuffle")[3:]) == ExitCode.STATE_UNUSABLE == 8
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("esa shuffle: error: unusable state: ") and words in err[-1], err
    assert str(state_file) in err[-1]
    assert state_file.read_bytes() == damage and ledger_entries(chain, "shuffle") == []  # untouched, nothing released


def test_a_damaged_ledger_entry_is_one_line_and_exit_8(broker, tmp_path, capsys) -> None:
    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "ledger")
    produce(chain, synthesize(spec, 200, windows=1, start_ms=recent_start(spec.window_seconds * 1000), seed=4))
    run_inline(chain, ("encode", "shuffle"))
    entries = sorted((chain.state("shuffle") / "ledger").rglob("*.json"))
    assert entries, "the first run sealed nothing"
    entries[0].write_bytes(entries[0].read_bytes()[:-9])  # torn, as only a damaged disk or another writer can

    assert cli.main(cli_argv(chain, "shuffle")[3:]) == ExitCode.STATE_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("esa shuffle: error: unusable state: corrupt state file ") and str(entries[0]) in err


def _recreate(bootstrap: str, topic: str, records: int) -> None:
    """Delete ``topic`` and create it again (3 partitions), holding ``records`` junk records: a rewound log."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures die with it
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, what=f"{topic} to be deleted")
    ensure_topics(bootstrap, [topic], partitions=3)
    produce_records(bootstrap, topic, [(None, b"junk %d" % i) for i in range(records)])


def test_a_recreated_topic_is_refused_not_silently_skipped(broker, tmp_path, capsys) -> None:
    """Before: the job warned, read from the new end and saved it, so the new log's first records were never
    read by anyone. Now it refuses (exit 8) until pointed at a new topic name."""
    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "rewound")
    produce(chain, synthesize(spec, 300, windows=1, start_ms=recent_start(spec.window_seconds * 1000), seed=6))
    first = run_inline(chain, ("encode", "shuffle"))["shuffle"]
    assert first.balanced and first.count("kafka_records_read") > 30
    state_file = chain.state("shuffle") / "run_state.json"
    before, sealed = state_file.read_bytes(), ledger_entries(chain, "shuffle")

    _recreate(broker.bootstrap, chain.reports, records=6)
    assert cli.main(cli_argv(chain, "shuffle")[3:]) == ExitCode.STATE_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("esa shuffle: error: unusable state: the log is shorter than what this job has already "
                          f"read ({chain.reports}[") and "Nothing was read" in err and "new topic name" in err
    assert state_file.read_bytes() == before and ledger_entries(chain, "shuffle") == sealed

    renamed = replace(chain, reports=f"{chain.reports}-new")  # the documented way on: a new log, a new name
    ensure_topics(broker.bootstrap, [renamed.reports], partitions=3)
    produce_records(broker.bootstrap, renamed.reports, [(None, b"junk %d" % i) for i in range(6)])
    again = run_inline(renamed, ("shuffle",))["shuffle"]
    assert again.balanced and again.count("kafka_records_read") == 6 == again.count("dead_lettered")
    assert ledger_entries(renamed, "shuffle") == sealed  # released windows stay released, once
