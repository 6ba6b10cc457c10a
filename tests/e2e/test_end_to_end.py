"""The whole chain against a real tansu broker on loopback and the real FnApiRunner.

Produce a synthetic population (plus one record of every bad kind), run encode ▸ shuffle ▸ analyze, and
check what a user relies on: estimates within their error bars, every record accounted for, each bad
record dead-lettered with its reason, offsets committed, and a second run reading nothing new.
"""

from __future__ import annotations

from pathlib import Path

import fastavro
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.end_to_end import run
from pipelines.job import JobConfig
from pipelines.population import synthesize, truth_table
from pipelines.simulate import produce_population
from transforms.kafkaio import plan_bounded_read
from transforms.spec import spec_from_dict

N_CLIENTS = 6000
BAD_PER_KIND = 2


def _spec(mechanism: str, publish_deletions: bool = False) -> object:
    return spec_from_dict({
        "analysis": {"name": f"e2e_{mechanism}", "metric": f"e2e_{mechanism}"},
        "domain": {"size": 12},
        "mechanism": {"name": mechanism, "epsilon": 3.0},
        "window": {"size_seconds": 3600},
        "crowd": {"epsilon": 1.0, "delta": 1e-6, "publish_deletions": publish_deletions},
        "privacy": {"delta": 1e-6},
    }, source="test")


@pytest.fixture(scope="module", params=["grr", "oue", "olh"])
def first_run(request: pytest.FixtureRequest, broker, tmp_path_factory: pytest.TempPathFactory):
    """One produce + run per mechanism, shared by the assertions below."""
    spec = _spec(request.param)
    population = synthesize(spec, N_CLIENTS, seed=11)
    topics = {"raw_topic": f"raw-{request.param}-{id(spec)}", "reports_topic": f"rep-{request.param}-{id(spec)}"}
    produced = produce_population(broker.bootstrap, spec, population, bad_per_kind=BAD_PER_KIND, seed=11, **topics)
    config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=tmp_path_factory.mktemp("run1"),
                            group_id=f"g-{request.param}-{id(spec)}", seed=5, **topics)
    return spec, population, produced, config, run(config)


def test_estimates_within_error_bars(first_run) -> None:
    spec, population, _, _, summary = first_run
    est = pq.read_table(summary.estimates_path).to_pydict()
    truth = truth_table(spec, population).to_pydict()
    assert len(est["item"]) == spec.d
    order = np.argsort(est["item_index"])
    estimate, stderr = np.asarray(est["estimate"])[order], np.asarray(est["stderr"])[order]
    z = np.abs(estimate - np.asarray(truth["frequency"])) / stderr
    # 12 items, each z ~ N(0,1) (n = 6,000 makes the normal approximation good); 4.5 is the
    # Bonferroni bound for 12 items at a family-wise false-alarm rate below 1e-4.
    assert z.max() < 4.5, z
    assert abs(estimate.sum() - 1.0) < 5 * np.sqrt((stderr ** 2).sum())
    assert set(est["n_deleted"]) == {None}
    assert est["eps_central"][0] < est["eps_local"][0] == spec.epsilon


def test_every_record_accounted_for(first_run) -> None:
    _, _, produced, _, summary = first_run
    acc = summary.accounting
    assert acc["read"] == sum(produced.values())
    assert summary.balanced, acc
    # Bad kinds: 2 in the raw topic (not Avro, unknown category) + duplicate, 3 in the reports topic.
    assert acc["dead_lettered"] == 6 * BAD_PER_KIND
    assert acc["valid"] == N_CLIENTS
    assert 0 < acc["deleted"] < 200  # T ≈ 29 for crowd eps 1, delta 1e-6; sd ≈ 2.8


def test_each_bad_record_dead_lettered_with_reason(first_run) -> None:
    _, _, _, config, summary = first_run
    with open(summary.dead_letters_path, "rb") as f:
        letters = list(fastavro.reader(f))
    reasons = [d["reason"] for d in letters]
    expected = {
        "not an Avro single-object message": BAD_PER_KIND,
        "unknown spec_id": BAD_PER_KIND,
        "unknown Report schema_version 99": BAD_PER_KIND,
        "is not in the domain": BAD_PER_KIND,
        "outside the output domain": BAD_PER_KIND,
        "duplicate: client": BAD_PER_KIND,
    }
    for fragment, count in expected.items():
        assert sum(fragment in r for r in reasons) == count, (fragment, reasons)
    for d in letters:
        assert d["topic"] in {config.raw_topic, config.reports_topic}
        assert d["offset"] is not None and d["original"]


def test_offsets_committed_and_second_run_reads_nothing(first_run, broker, tmp_path: Path) -> None:
    _, _, _, config, _ = first_run
    for topic in (config.raw_topic, config.reports_topic):
        plan = plan_bounded_read(broker.bootstrap, topic, config.group_id)
        assert plan and all(r.start == r.stop for r in plan), plan
    again = run(JobConfig(**{**config.__dict__, "out_dir": tmp_path}))
    assert again.accounting["read"] == 0
    assert pq.read_table(again.estimates_path).num_rows == 0


def test_deletions_published_only_when_the_spec_allows(broker, tmp_path: Path) -> None:
    """n_deleted is null by default (it would reveal the exact crowd size) and exact when opted in."""
    spec = _spec("grr", publish_deletions=True)
    population = synthesize(spec, 2000, windows=2, seed=4)
    topics = {"raw_topic": f"raw-pub-{tmp_path.name}", "reports_topic": f"rep-pub-{tmp_path.name}"}
    produce_population(broker.bootstrap, spec, population, **topics)
    summary = run(JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=tmp_path,
                                 group_id=f"g-pub-{tmp_path.name}", seed=8, **topics))
    est = pq.read_table(summary.estimates_path).to_pydict()
    per_window = {w: d for w, d in zip(est["window_start"], est["n_deleted"], strict=True)}
    assert len(per_window) == 2
    assert sum(per_window.values()) == summary.count("reports_deleted") > 0
    n_by_window = {w: n for w, n in zip(est["window_start"], est["n_reports"], strict=True)}
    truth = truth_table(spec, population).to_pydict()
    for w, deleted in per_window.items():
        crowd = sum(c for ws, c in zip(truth["window_start"], truth["count"], strict=True) if ws == w)
        assert n_by_window[w] + deleted == crowd
