"""Output topics are checked before anything is sealed, and dead letters stay in their domain on Kafka too.

Issue 26, finding 6: ``--shuffled_topic shufled`` (a typo) was auto-created by the first publish, the ledger
said "published" and the job exited 0; nothing read that topic. Now a job refuses to start while a topic it
writes is missing (exit 4, naming the closest existing topic) unless ``--create_topics`` is given.
Finding 7: ``--dead_letter_topic`` carried every domain's raw bytes in one topic; now each job publishes to its
own domain's topic (``PREFIX-encode``, ``PREFIX-shuffle``, ``PREFIX-analyze``), the analyzer's without raw
bytes, so the broker's ACLs can give each principal only its own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines import analyze as analyze_job
from pipelines import encode as encode_job
from pipelines import shuffle as shuffle_job
from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.job_config import JobConfig
from pipelines.preflight import MissingTopicsError, existing_topics
from schemas import decode_record
from tests.e2e.adversary import attacker_key, forged_release
from tests.e2e.chain import bad_device_sets, enrol
from transforms.io.kafka.bounded import ensure_topics, produce_records, read_topic
from transforms.spec import spec_from_dict
from transforms.state.ledger import ReleaseLedger
from transforms.trust.message_set import SealedMessage

pytestmark = pytest.mark.slow
N = 300


@pytest.fixture(scope="module")
def chain(broker, tmp_path_factory: pytest.TempPathFactory):
    spec = spec_from_dict({"analysis": {"name": "outputs", "metric": "outputs"}, "domain": {"size": 4},
                           "mechanism": {"name": "grr", "epsilon": 3.0}, "window": {"size_seconds": 600},
                           "crowd": {"min_clients": 10}}, source="test")
    base = tmp_path_factory.mktemp("outputs")
    population = synthesize(spec, N, windows=1, seed=3)
    keys = enrol(base, population)
    raw_bad, reports_bad, extra = bad_device_sets(keys, spec, population, 1, seed=3)
    enrol(base, population, tuple(extra))
    topics = {"raw_topic": f"{base.name}-raw", "reports_topic": f"{base.name}-rep",
              "shuffled_topic": f"{base.name}-shuffled"}
    produce_population(broker.bootstrap, spec, population, **{k: topics[k] for k in ("raw_topic", "reports_topic")})
    produce_records(broker.bootstrap, topics["raw_topic"], raw_bad)
    produce_records(broker.bootstrap, topics["reports_topic"], reports_bad)

    def config(stage: str, **changes) -> JobConfig:
        return replace(JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=base / stage,
                                 state_dir=base / "state" / stage, keys_dir=keys, group_id=f"{base.name}-{stage}",
                                 seed=5, drain=True, dead_letter_topic=f"{base.name}-dead", **topics), **changes)

    return config, topics, base


def test_a_missing_output_topic_stops_the_job_before_anything_is_sealed(chain, broker) -> None:
    config, topics, base = chain
    with pytest.raises(MissingTopicsError, match="do not exist") as refused:
        encode_job.run(config("encode"))  # its reports topic exists, its dead-letter topic does not
    assert f"{base.name}-dead-encode" in str(refused.value)
    encoded = encode_job.run(config("encode", create_topics=True))
    assert encoded.count("events_encoded") > 0
    typo = f"{base.name}-shufled"
    ensure_topics(broker.bootstrap, [topics["shuffled_topic"], f"{base.name}-dead-shuffle"], partitions=2)
    with pytest.raises(MissingTopicsError, match=f"did you mean '{topics['shuffled_topic']}'"):
        shuffle_job.run(config("shuffle", shuffled_topic=typo, create_topics=False))
    assert typo not in existing_topics(broker.bootstrap)  # never created
    ledger = ReleaseLedger(base / "state" / "shuffle" / "ledger")
    assert not list(ledger.entries(config("shuffle").specs[0].spec_id))  # nothing sealed
    shuffled = shuffle_job.run(config("shuffle"))  # the topics it writes exist: no flag needed
    assert shuffled.extra["releases"] == 1
    assert {e.status for e in ledger.entries(config("shuffle").specs[0].spec_id)} == {"published"}
    assert read_topic(broker.bootstrap, topics["shuffled_topic"])


def test_each_domain_publishes_its_dead_letters_to_its_own_topic(chain, broker) -> None:
    config, topics, base = chain
    ensure_topics(broker.bootstrap, [f"{base.name}-dead-analyze"])
    spec = config("analyze").specs[0]
    stranger = attacker_key()[1]  # a release batch the shuffler did not sign: the analyzer's to refuse
    forged = forged_release(spec, [SealedMessage(0, b"x" * 60)], window_end=1_800_000, n_sets=50,
                            key_id="20260101-0badc0de", signer=stranger)
    produce_records(broker.bootstrap, topics["shuffled_topic"], [(None, v) for v in forged])
    analyze_job.run(config("analyze"))
    letters = {domain: [decode_record("DeadLetter", r.value)
                        for r in read_topic(broker.bootstrap, f"{base.name}-dead-{domain}")]
               for domain in ("encode", "shuffle", "analyze")}
    assert {d["stage"] for d in letters["encode"]} <= {"decode", "encode"} and letters["encode"]
    assert {d["stage"] for d in letters["shuffle"]} <= {"ingress", "shuffle"} and letters["shuffle"]
    # what the analyzer refused: a reason and a position, never bytes (its own file keeps none either)
    assert letters["analyze"] and all(d["original"] is None for d in letters["analyze"])
    assert all(d["reason"] and d["topic"] and d["offset"] is not None for d in letters["analyze"])
    assert all(d["original"] for d in letters["encode"])  # raw bytes stay in the encoder's own topic
    assert f"{base.name}-dead" not in existing_topics(broker.bootstrap)  # no topic shared by the domains
