"""The streaming shuffler's accounting from durable facts (``pipelines.stream_accounting``), on a real broker:
the records consumed are counted between offsets read_committed (the encoder's commit markers are not records);
a lineage starts where a fresh source starts, a suspended run carries its terms to the run that resumes its
savepoint, and a resume from any other savepoint is refused in one line."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from pipelines import stream_accounting
from pipelines.exit_codes import JobUsageError
from tests.e2e.chain_harness import SPEC_PATH, new_chain, produce, recent_start, run_inline, topic_records
from transforms.io.kafka.clients import consumer
from transforms.spec import load_spec


def test_a_lineage_counts_records_between_offsets_and_carries_a_suspended_run(broker, tmp_path) -> None:
    from pipelines.demo.population import synthesize

    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "acct")
    produce(chain, synthesize(spec, 120, start_ms=recent_start(spec.window_seconds * 1000), seed=11))
    run_inline(chain, ("encode",))  # reports in transactions: a commit marker after each
    config = chain.config("shuffle")
    config.state.mkdir(parents=True)
    lineage = stream_accounting.begin(config, None, "stream-a")
    assert lineage.start == {0: 0, 1: 0, 2: 0}  # no commit yet: the partitions' beginnings
    probe = consumer(config.kafka_client, config.bootstrap, config.group_id)
    try:
        _, ends = probe.offsets(str(config.reports_topic), [0, 1, 2])
        probe.commit(str(config.reports_topic), ends)  # as the source commits: past the last commit marker
    finally:
        probe.close()
    records = topic_records(config.bootstrap, str(config.reports_topic))
    assert sum(ends.values()) > records  # the markers take offsets
    assert stream_accounting.records_between(config, lineage.start, ends) == records

    first = SimpleNamespace(sets_decided=100, sets_released=90, dead_letters=4)
    stream_accounting.suspend(config, lineage, first, {"sets_duplicate": 1}, "file:///savepoints/sp-1")
    with pytest.raises(JobUsageError, match="sp-1"):
        stream_accounting.begin(config, "file:///savepoints/sp-0", "stream-b")
    resumed = stream_accounting.begin(config, "file:///savepoints/sp-1", "stream-b")
    assert resumed.start == lineage.start and resumed.savepoint is None
    second = SimpleNamespace(sets_decided=10, sets_released=8, dead_letters=0)
    read, parts = stream_accounting.durable(config, resumed, second, {"records_reread": 2})
    assert read == records
    assert parts == {"dead_lettered": 4, "reread": 2, "held": 0, "deleted": 12, "duplicate": 1, "released": 98}
    with pytest.raises(JobUsageError, match="no suspended run"):  # resumed: the savepoint is spent
        stream_accounting.begin(config, "file:///savepoints/sp-1", "stream-c")


def test_a_killed_drivers_run_is_carried_from_its_ledger_entries_and_dead_letter_counts(tmp_path) -> None:
    """A driver killed mid-run accounted for nothing itself: the driver that resumes its orphaned job carries
    the dead run's sealed windows (released and decided sets, withheld ones included) and its dead letters,
    and nothing another run of the state directory sealed."""
    from pipelines.stream_accounting import Lineage
    from transforms.shuffler.release_agent import DECIDED
    from transforms.shuffler.release_step import withheld_entry
    from transforms.state.dead_letters import ReasonCounts, write_counts
    from transforms.state.layout import StateDir
    from transforms.state.ledger import ReleaseEntry, ReleaseKey, ReleaseLedger

    state = tmp_path / "state"
    state.mkdir()
    config = SimpleNamespace(state=state, state_layout=StateDir(state))
    Lineage({0: 5}, dict.fromkeys(stream_accounting.CARRIED, 1), live="stream-dead").save(state)
    ledger = ReleaseLedger(config.state_layout.ledger)

    def released(end: int, run_key: str, n_sets: int, decided: int) -> ReleaseEntry:
        return ReleaseEntry(key=ReleaseKey("s", "c", end), release_id=f"r{end}", digest=f"d{end}", n_sets=n_sets,
                            n_messages=n_sets, batches=1, source_ends={}, run_key=run_key, sealed_at_ms=1,
                            extra={DECIDED: decided})

    ledger.seal(released(1000, "stream-dead", 40, 45))
    ledger.seal(released(2000, "stream-other", 7, 9))  # an earlier lineage's window: not the dead run's
    withheld = withheld_entry(ReleaseKey("s", "d", 1000), {}, "stream-dead")
    ledger.seal_many([replace(withheld, extra={DECIDED: 3})])
    counts = config.state_layout.dead_letters / "counts"
    counts.mkdir(parents=True)
    write_counts(counts, "stream-dead-0123456789abcdef", ReasonCounts().add("shuffle", "bad_signature", 2))
    write_counts(counts, "stream-other-0123456789abcdef", ReasonCounts().add("shuffle", "bad_signature", 5))

    stream_accounting.adopt(config, ledger, "file:///savepoints/sp-9")
    resumed = stream_accounting.begin(config, "file:///savepoints/sp-9", "stream-next")
    assert resumed.start == {0: 5} and resumed.live == "stream-next"
    assert resumed.carried == {"decided": 1 + 45 + 3, "released": 1 + 40, "dead_lettered": 1 + 2, "duplicate": 1,
                               "reread": 1}
