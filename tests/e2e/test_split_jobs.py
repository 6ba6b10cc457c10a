"""The three stages as separate jobs linked by Kafka topics (the production layout, docs/architecture.md).

encode (raw -> signed, sealed message sets), shuffle (sets -> signed release batches), analyze (batches
-> estimates), each with its own state directory and accounting, against a real broker. The shuffled
topic must carry nothing that identifies a client, and the analyzer must refuse release batches the
shuffler did not sign or that do not fit a window.
"""

from __future__ import annotations

from pathlib import Path

import fastavro
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipelines import analyze as analyze_job
from pipelines import encode as encode_job
from pipelines import shuffle as shuffle_job
from pipelines.demo.population import synthesize, truth_table
from pipelines.demo.simulate import produce_population
from pipelines.job_config import JobConfig, default_keys_dir
from tests.e2e.chain import ENCODER_REASONS, SHUFFLER_REASONS, bad_device_sets, enrol
from transforms.io.kafka.bounded import ensure_topics, produce_records, read_topic
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_shuffler_signer
from transforms.trust.message_set import SealedMessage
from transforms.trust.release import (
    ReleaseBatch,
    decode_release_batch,
    encode_release_batch,
    release_id_of,
    sign_release_batch,
)

N = 4000
FORGED_REASONS = ("window_end is not the end of a 600 s window", "unauthenticated release batch")


def _forged_batches(keys: Path, spec_id: str) -> list[tuple[bytes, bytes]]:
    """A shuffler-signed batch whose window end is no window boundary, and an aligned batch signed by a stranger."""
    key_id, signer = load_shuffler_signer(keys)
    out = []
    for end, key in ((12345, signer), (600_000 * 3, Ed25519PrivateKey.generate())):
        rid = release_id_of(spec_id, None, end)
        batch = ReleaseBatch(rid, spec_id, None, end, 0, 1, 50, 1, None, (SealedMessage(0, b"x" * 60),))
        out.append((f"{rid}:0".encode(), encode_release_batch(sign_release_batch(batch, key_id, key))))
    return out


@pytest.fixture(scope="module")
def chain(broker, tmp_path_factory: pytest.TempPathFactory):
    spec = spec_from_dict({
        "analysis": {"name": "split", "metric": "split"}, "domain": {"size": 10},
        "mechanism": {"name": "olh", "epsilon": 3.0}, "window": {"size_seconds": 600},
    }, source="test")
    population = synthesize(spec, N, windows=2, seed=21)
    base = tmp_path_factory.mktemp("split")
    keys = enrol(base, population)
    raw_bad, reports_bad, extra = bad_device_sets(keys, spec, population, 1, seed=21)
    enrol(base, population, tuple(extra))
    topics = {"raw_topic": f"split-raw-{base.name}", "reports_topic": f"split-rep-{base.name}",
              "shuffled_topic": f"split-shuf-{base.name}"}
    produced = produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                                  reports_topic=topics["reports_topic"])
    produced[topics["raw_topic"]] += produce_records(broker.bootstrap, topics["raw_topic"], raw_bad)
    produced[topics["reports_topic"]] += produce_records(broker.bootstrap, topics["reports_topic"], reports_bad)
    ensure_topics(broker.bootstrap, [topics["shuffled_topic"]], partitions=2)

    def config(stage: str) -> JobConfig:  # one trust domain each: own output and state, shared key directory
        return JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=base / stage,
                         state_dir=base / "state" / stage, keys_dir=keys, group_id=f"split-{stage}-{base.name}",
                         seed=13, drain=True, create_topics=True, **topics)

    summaries = {"encode": encode_job.run(config("encode"))}
    summaries["shuffle"] = shuffle_job.run(config("shuffle"))
    published = len(read_topic(broker.bootstrap, topics["shuffled_topic"]))
    produce_records(broker.bootstrap, topics["shuffled_topic"], _forged_batches(keys, spec.spec_id))
    summaries["analyze"] = analyze_job.run(config("analyze"))
    return spec, population, produced, topics, summaries, published, base


def test_each_job_accounts_for_every_record(chain) -> None:
    _, _, produced, topics, summaries, published, base = chain
    for stage, summary in summaries.items():
        assert summary.balanced, (stage, summary.accounting)
        assert (base / "state" / stage / "run_state.json").exists()
    enc, shuf, ana = (summaries[s].accounting for s in ("encode", "shuffle", "analyze"))
    assert enc["read"] == produced[topics["raw_topic"]]
    assert enc["dead_lettered"] == sum(ENCODER_REASONS.values())  # not Avro, not in the domain
    # The shuffle job reads the reports topic: the bad device traffic plus everything encoded.
    assert shuf["read"] == enc["encoded"] + produced[topics["reports_topic"]]
    assert shuf["dead_lettered"] == sum(SHUFFLER_REASONS.values()) + 1  # ingress refusals; the duplicate
    assert shuf["held"] == 0 and summaries["shuffle"].extra["releases"] == 2  # two windows, drained
    assert published >= 2
    assert ana["read"] == published + 2 and ana["dead_lettered"] == 2
    assert ana["analyzed"] == published


def test_shuffled_topic_identifies_no_client(chain, broker) -> None:
    spec, population, _, topics, summaries, published, base = chain
    records = read_topic(broker.bootstrap, topics["shuffled_topic"])
    batches = [decode_release_batch(r.value) for r in records]
    assert all(r.key == f"{b.release_id}:{b.batch_index}".encode() for r, b in zip(records, batches, strict=True))
    genuine = [b for b in batches if b.window_end_ms > population.event_times_ms.min()]  # not the 1970 forgeries
    assert len(genuine) == published == len(batches) - 2
    assert sum(b.n_sets for b in {b.release_id: b for b in genuine}.values()) == summaries["shuffle"].count(
        "sets_released")
    blob = b"".join(r.value for r in records) + b"".join(r.key for r in records)
    fleet = SimulatedFleet.from_keys_dir(default_keys_dir(base))
    for client in population.client_ids[:200]:
        assert client.encode() not in blob and fleet.device_id(client).encode() not in blob
    ends = {b.window_end_ms for b in genuine}
    assert len(ends) == 2 and all(e % (spec.window_seconds * 1000) == 0 for e in ends)
    assert not {int(t) for t in population.event_times_ms} & ends


def test_estimates_from_the_split_jobs(chain) -> None:
    spec, population, _, _, _, _, base = chain
    est = read_estimates(base / "analyze").to_pydict()
    truth = truth_table(spec, population).to_pydict()
    expected = {(w, i): f for w, i, f in zip(truth["window_start"], truth["item_index"], truth["frequency"],
                                             strict=True)}
    assert len(est["item"]) == 2 * spec.d  # two windows
    z = [abs(e - expected[(w, i)]) / s for w, i, e, s in zip(est["window_start"], est["item_index"],
                                                             est["estimate"], est["stderr"], strict=True)]
    assert max(z) < 4.5  # 20 estimates, Bonferroni at 1e-4
    assert np.all(np.asarray(est["eps_central"]) < spec.epsilon)
    letters = []
    for path in (base / "state" / "analyze" / "dead_letters").glob("dead-letters-*.avro"):  # the job's own state
        with path.open("rb") as f:
            letters.extend(fastavro.reader(f))
    forged = [d for d in letters if "unusable message" not in d["reason"]]
    assert {d["stage"] for d in letters} == {"analyze"} and all(d["original"] is None for d in letters)
    assert sorted(any(r in d["reason"] for r in FORGED_REASONS) for d in forged) == [True, True]
    assert {r for r in FORGED_REASONS if any(r in d["reason"] for d in forged)} == set(FORGED_REASONS)
