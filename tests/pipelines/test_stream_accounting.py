"""The streaming shuffler's accounting from durable facts (``pipelines.stream_accounting``), on a real broker:
the records consumed are counted between offsets read_committed (the encoder's commit markers are not records);
a lineage starts where a fresh source starts, a suspended run carries its terms to the run that resumes its
savepoint, and a resume from any other savepoint is refused in one line."""

from __future__ import annotations

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
    lineage = stream_accounting.begin(config, None)
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
        stream_accounting.begin(config, "file:///savepoints/sp-0")
    resumed = stream_accounting.begin(config, "file:///savepoints/sp-1")
    assert resumed.start == lineage.start and resumed.savepoint is None
    second = SimpleNamespace(sets_decided=10, sets_released=8, dead_letters=0)
    read, parts = stream_accounting.durable(config, resumed, second, {"records_reread": 2})
    assert read == records
    assert parts == {"dead_lettered": 4, "reread": 2, "held": 0, "deleted": 12, "duplicate": 1, "released": 98}
    with pytest.raises(JobUsageError, match="no suspended run"):  # resumed: the savepoint is spent
        stream_accounting.begin(config, "file:///savepoints/sp-1")
