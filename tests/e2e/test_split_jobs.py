"""The three stages as separate jobs linked by Kafka topics (the production layout, docs/architecture.md).

encode (raw -> reports), shuffle (reports -> shuffled), analyze (shuffled -> estimates), each with its own
accounting, against a real broker. The shuffled topic must carry nothing that identifies a client.
"""

from __future__ import annotations

from pathlib import Path

import fastavro
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines import analyze as analyze_job
from pipelines import encode as encode_job
from pipelines import shuffle as shuffle_job
from pipelines.job import JobConfig
from pipelines.population import synthesize, truth_table
from pipelines.simulate import produce_population
from schemas import SCHEMA_VERSION, decode_record, encode_record
from transforms.kafkaio import ensure_topics, produce_records, read_topic
from transforms.spec import spec_from_dict

N = 4000


@pytest.fixture(scope="module")
def chain(broker, tmp_path_factory: pytest.TempPathFactory):
    spec = spec_from_dict({
        "analysis": {"name": "split", "metric": "split"}, "domain": {"size": 10},
        "mechanism": {"name": "olh", "epsilon": 3.0}, "window": {"size_seconds": 600},
    }, source="test")
    population = synthesize(spec, N, windows=2, seed=21)
    base = tmp_path_factory.mktemp("split")
    topics = {"raw_topic": f"split-raw-{base.name}", "reports_topic": f"split-rep-{base.name}",
              "shuffled_topic": f"split-shuf-{base.name}"}
    produced = produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                                  reports_topic=topics["reports_topic"], bad_per_kind=1, seed=21)
    ensure_topics(broker.bootstrap, [topics["shuffled_topic"]], partitions=2)

    def config(stage: str) -> JobConfig:
        return JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=base / stage,
                         group_id=f"split-{stage}-{base.name}", seed=13, **topics)

    summaries = {"encode": encode_job.run(config("encode"))}
    summaries["shuffle"] = shuffle_job.run(config("shuffle"))
    # A forged record on the shuffled topic: a window end that is not a window boundary.
    forged = {"schema_version": SCHEMA_VERSION, "spec_id": spec.spec_id, "channel": 0, "window_end": 12345,
              "payload": ("esa.telemetry.HashedPayload", {"seed": 1, "z": 1})}
    produce_records(broker.bootstrap, topics["shuffled_topic"], [encode_record("ShuffledReport", forged)])
    summaries["analyze"] = analyze_job.run(config("analyze"))
    return spec, population, produced, topics, summaries


def test_each_job_accounts_for_every_record(chain) -> None:
    _, _, produced, _, summaries = chain
    for stage, summary in summaries.items():
        assert summary.balanced, (stage, summary.accounting)
    enc, shuf, ana = (summaries[s].accounting for s in ("encode", "shuffle", "analyze"))
    assert enc["read"] == produced[next(iter(produced))]  # the raw topic
    assert enc["dead_lettered"] == 2  # not Avro, unknown category
    # The shuffle job reads the device reports topic: the bad device reports plus everything encoded.
    assert shuf["read"] == enc["encoded"] + 3
    assert shuf["dead_lettered"] == 3 + 1  # unknown spec, version 99, out of domain; the duplicate
    assert ana["read"] == shuf["released"] + 1 and ana["dead_lettered"] == 1
    assert ana["analyzed"] == shuf["released"]


def test_shuffled_topic_identifies_no_client(chain, broker) -> None:
    _, population, _, topics, _ = chain
    records = read_topic(broker.bootstrap, topics["shuffled_topic"])
    assert records and all(r.key is None for r in records)
    decoded = [decode_record("ShuffledReport", r.value) for r in records]
    assert set(decoded[0]) == {"schema_version", "spec_id", "crowd_id", "channel", "window_end", "payload"}
    blob = b"".join(r.value for r in records)
    for client in population.client_ids[:200]:
        assert client.encode() not in blob
    times = {int(t) for t in population.event_times_ms}
    assert not times & {d["window_end"] for d in decoded}


def test_estimates_from_the_split_jobs(chain) -> None:
    spec, population, _, _, summaries = chain
    est = pq.read_table(summaries["analyze"].estimates_path).to_pydict()
    truth = truth_table(spec, population).to_pydict()
    expected = {(w, i): f for w, i, f in zip(truth["window_start"], truth["item_index"], truth["frequency"],
                                             strict=True)}
    assert len(est["item"]) == 2 * spec.d  # two windows
    z = [abs(e - expected[(w, i)]) / s for w, i, e, s in zip(est["window_start"], est["item_index"],
                                                             est["estimate"], est["stderr"], strict=True)]
    assert max(z) < 4.5  # 20 estimates, Bonferroni at 1e-4
    assert np.all(np.asarray(est["eps_central"]) < spec.epsilon)
    with open(Path(summaries["analyze"].dead_letters_path), "rb") as f:
        letters = list(fastavro.reader(f))
    assert [d["stage"] for d in letters] == ["analyze"] and "window_end 12345" in letters[0]["reason"]
