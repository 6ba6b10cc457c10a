"""Shuffler key rotation, done as documented, loses no window.

Issue 26, finding 4: a release signed with a new shuffler key before the analyzer had its public key was
dead-lettered as "unknown shuffler key id" and then lay below the analyzer's offset for ever (no estimate, the
shuffler's ledger saying "published"). Now the analyzer holds such batches (its resume offset stays on them)
and retries them every run; once the public key is distributed, the window is analyzed. The procedure
(docs/operations.md): ``python -m transforms.trust rotate shuffler KEYS`` in the shuffler's keys directory,
then copy ``public/shuffler-<new id>.ed25519.pub`` to the analyzer's, in either order.
"""

from __future__ import annotations

import shutil

import pytest

from pipelines import analyze as analyze_job
from pipelines import encode as encode_job
from pipelines import shuffle as shuffle_job
from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.job_config import JobConfig
from tests.e2e.chain import enrol
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates
from transforms.trust.__main__ import main as trust_cli

pytestmark = pytest.mark.slow
N = 300


def test_a_release_signed_with_a_key_not_yet_distributed_waits_for_it(broker, tmp_path) -> None:
    spec = spec_from_dict({"analysis": {"name": "rotation", "metric": "rotation"}, "domain": {"size": 4},
                           "mechanism": {"name": "grr", "epsilon": 3.0}, "window": {"size_seconds": 600},
                           "crowd": {"min_clients": 10}}, source="test")
    population = synthesize(spec, N, windows=1, seed=4)
    keys = enrol(tmp_path, population)  # the shuffler's (and, for brevity, the encoder's) keys directory
    analyzer_keys = tmp_path / "analyzer-keys"
    shutil.copytree(keys, analyzer_keys)  # what the analyzer was given before the rotation
    topics = {"raw_topic": f"{tmp_path.name}-raw", "reports_topic": f"{tmp_path.name}-rep",
              "shuffled_topic": f"{tmp_path.name}-shuffled"}
    produce_population(broker.bootstrap, spec, population, **{k: topics[k] for k in ("raw_topic", "reports_topic")})

    def config(stage: str, keys_dir=keys) -> JobConfig:
        return JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=tmp_path / stage,
                         state_dir=tmp_path / "state" / stage, keys_dir=keys_dir, group_id=f"{tmp_path.name}-{stage}",
                         seed=5, drain=True, create_topics=True, **topics)

    assert trust_cli(["rotate", "shuffler", str(keys)]) == 0  # the shuffler signs with the new key from now on
    encode_job.run(config("encode"))
    shuffled = shuffle_job.run(config("shuffle"))
    assert shuffled.extra["releases"] == 1
    waiting = analyze_job.run(config("analyze", analyzer_keys))
    assert waiting.balanced and waiting.accounting["dead_lettered"] == 0
    assert waiting.accounting["held"] == waiting.accounting["read"] > 0
    assert not (tmp_path / "analyze" / "estimates").exists() or read_estimates(tmp_path / "analyze").num_rows == 0
    again = analyze_job.run(config("analyze", analyzer_keys))  # still not distributed: still held, not lost
    assert again.accounting["held"] == waiting.accounting["held"] and again.accounting["dead_lettered"] == 0
    for public in (keys / "public").glob("shuffler-*.ed25519.pub"):  # distribute the new public key
        shutil.copy2(public, analyzer_keys / "public" / public.name)
    done = analyze_job.run(config("analyze", analyzer_keys))
    assert done.balanced and done.accounting["dead_lettered"] == 0 and done.count("batches_analyzed") > 0
    assert read_estimates(tmp_path / "analyze").num_rows == spec.d
