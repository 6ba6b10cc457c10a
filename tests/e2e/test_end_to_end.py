"""The whole chain against a real Apache Kafka broker on loopback and the real FnApiRunner.

Produce an enrolled synthetic population (plus records of every bad kind, raw and signed), run
encode ▸ shuffle ▸ analyze, and check what a user relies on: estimates within their error bars, every
record of every stage accounted for, each bad record dead-lettered with its reason in the right trust
domain, offsets committed, and a second run reading nothing new.
"""

from __future__ import annotations

from pathlib import Path

import fastavro
import numpy as np
import pytest

from pipelines.demo.population import synthesize, truth_table
from pipelines.demo.simulate import produce_population
from pipelines.end_to_end import run
from pipelines.job_config import GroupInUse, JobConfig
from tests.e2e.chain import (
    DUPLICATE_REASON,
    ENCODER_REASONS,
    SHUFFLER_REASONS,
    UNUSABLE_REASON,
    bad_device_sets,
    enrol,
)
from transforms.io.kafka.bounded import plan_bounded_read, produce_records, read_topic
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates

N_CLIENTS = 4000
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


def _letters(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("dead-letters-*.avro")):
        with path.open("rb") as f:
            out.extend(fastavro.reader(f))
    return out


@pytest.fixture(scope="module", params=["grr", "oue", "olh"])
def first_run(request: pytest.FixtureRequest, broker, tmp_path_factory: pytest.TempPathFactory):
    """One produce + run per mechanism, shared by the assertions below."""
    spec = _spec(request.param)
    out = tmp_path_factory.mktemp(f"run1-{request.param}")
    population = synthesize(spec, N_CLIENTS, seed=11)  # the last complete window before now
    keys = enrol(out, population)
    raw_bad, reports_bad, extra = bad_device_sets(keys, spec, population, BAD_PER_KIND, seed=11)
    enrol(out, population, tuple(extra))
    topics = {"raw_topic": f"raw-{request.param}-{out.name}", "reports_topic": f"rep-{request.param}-{out.name}",
              "shuffled_topic": f"shuf-{request.param}-{out.name}"}
    produced = produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                                  reports_topic=topics["reports_topic"])
    produced[topics["raw_topic"]] += produce_records(broker.bootstrap, topics["raw_topic"], raw_bad)
    produced[topics["reports_topic"]] += produce_records(broker.bootstrap, topics["reports_topic"], reports_bad)
    config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out, group_id=f"g-{out.name}", seed=5,
                       drain=True, **topics)
    return spec, population, produced, config, run(config)


def test_estimates_within_error_bars(first_run) -> None:
    spec, population, _, _, summary = first_run
    est = read_estimates(summary.out_dir).to_pydict()
    truth = truth_table(spec, population).to_pydict()
    assert len(est["item"]) == spec.d
    order = np.argsort(est["item_index"])
    estimate, stderr = np.asarray(est["estimate"])[order], np.asarray(est["stderr"])[order]
    z = np.abs(estimate - np.asarray(truth["frequency"])) / stderr
    # 12 items, each z ~ N(0,1) (n = 4,000 makes the normal approximation good); 4.5 is the
    # Bonferroni bound for 12 items at a family-wise false-alarm rate below 1e-4.
    assert z.max() < 4.5, z
    assert abs(estimate.sum() - 1.0) < 5 * np.sqrt((stderr ** 2).sum())
    assert set(est["n_deleted"]) == {None}
    assert est["eps_central"][0] < est["eps_local"][0] == spec.epsilon
    # The release's clients are the distinct devices whose sets the shuffler released and the analyzer could
    # open (the garbage-payload sets are released but unusable).
    shuffle, analyze = summary.stages["shuffle"], summary.stages["analyze"]
    unusable = analyze.count("messages_dead_lettered")
    assert set(est["n_clients"]) == {shuffle.count("sets_released") - unusable}
    assert set(est["n_reports"]) == {shuffle.count("messages_released") - unusable}
    assert len(set(est["release_id"])) == 1 and est["windows_composed"][0] == 1


def test_every_record_accounted_for(first_run) -> None:
    _, _, produced, config, summary = first_run
    enc, shuf, ana = (summary.stages[s] for s in ("encode", "shuffle", "analyze"))
    assert summary.balanced and all(s.balanced for s in (enc, shuf, ana)), summary.accounting
    assert enc.accounting["read"] == produced[config.raw_topic]
    assert enc.accounting["dead_lettered"] == sum(ENCODER_REASONS.values()) * BAD_PER_KIND
    assert enc.accounting["encoded"] == N_CLIENTS + BAD_PER_KIND  # the raw duplicates are encoded
    s = shuf.accounting
    assert s["read"] == enc.accounting["encoded"] + produced[config.reports_topic]
    assert s["read"] == s["dead_lettered"] + s["reread"] + s["held"] + s["deleted"] + s["released"]
    # Ingress refuses the bad sets; the shuffle itself refuses the duplicates.
    assert s["dead_lettered"] == (sum(SHUFFLER_REASONS.values()) + 1) * BAD_PER_KIND
    assert s["reread"] == s["held"] == 0
    valid = N_CLIENTS + BAD_PER_KIND  # plus the garbage-payload sets, authentic and one per device
    assert shuf.count("sets_valid") == shuf.count("distinct_devices") == valid
    assert 0 < s["deleted"] < 200  # T ≈ 29 for crowd eps 1, delta 1e-6; sd ≈ 2.8
    assert s["deleted"] + s["released"] == valid
    a = ana.accounting
    assert a["read"] == a["analyzed"] == shuf.extra["releases"] == 1
    assert a["dead_lettered"] == a["reread"] == a["duplicate"] == a["held"] == 0


def test_each_bad_record_dead_lettered_with_reason(first_run) -> None:
    _, _, _, config, summary = first_run
    raw = _letters(config.state / "encode" / "dead_letters")
    device = _letters(config.state / "shuffle" / "dead_letters")
    analyst = _letters(config.state / "analyze" / "dead_letters")  # every job keeps its own, in its state
    expected = [(raw, ENCODER_REASONS), (device, {**SHUFFLER_REASONS, DUPLICATE_REASON: 1})]
    for letters, reasons in expected:
        for fragment, count in reasons.items():
            assert sum(fragment in d["reason"] for d in letters) == count * BAD_PER_KIND, (fragment, letters)
    for d in raw:
        assert d["topic"] == config.raw_topic and d["offset"] is not None and d["original"]
    for d in device:
        assert d["topic"] == config.reports_topic and d["offset"] is not None
        # Raw bytes of what ingress refused stay in the shuffler's domain; a refused duplicate is an authentic
        # set whose bytes are not kept.
        assert bool(d["original"]) == (d["stage"] == "ingress")
    # A garbage payload is seen only by the analyzer, which keeps no bytes. It is lost only if the shuffler's
    # random deletion (about 1 set in 170 here) happened to delete its set.
    assert 1 <= len(analyst) <= BAD_PER_KIND
    assert len(analyst) == summary.stages["analyze"].count("messages_dead_lettered")
    for d in analyst:
        assert UNUSABLE_REASON in d["reason"] and d["original"] is None and d["topic"] == config.shuffled_topic


SHARED_BYTES = 32


def shared_substrings(haystack: list[bytes], needles: list[bytes], width: int = SHARED_BYTES) -> int:
    """How many ``width``-byte strings of ``needles`` occur anywhere in ``haystack`` (every offset of both)."""
    windows = {n[i:i + width] for n in needles for i in range(len(n) - width + 1)}
    return sum(h[i:i + width] in windows for h in haystack for i in range(len(h) - width + 1))


def test_the_reports_and_shuffled_topics_share_no_ciphertext(first_run, broker) -> None:
    """Nested encryption (issue 26, finding 1): the reports topic holds every set sealed whole to the shuffler,
    so whoever reads both topics (an operator, a backup, an analyzer with read on reports) finds no 32-byte
    string of a release in what a device sent, and cannot map a released message back to its device."""
    _, _, _, config, summary = first_run
    reports = [r.value for r in read_topic(broker.bootstrap, config.reports_topic) if r.value]
    released = [r.value for r in read_topic(broker.bootstrap, config.shuffled_topic) if r.value]
    assert len(reports) > N_CLIENTS and summary.stages["shuffle"].count("messages_released") > N_CLIENTS // 2
    assert sum(map(len, released)) > 32 * N_CLIENTS // 2  # the released ciphertexts are there to be found
    assert shared_substrings(reports, released) == 0


def test_offsets_committed_and_second_run_reads_nothing(first_run, broker, tmp_path: Path) -> None:
    _, _, _, config, _ = first_run
    for topic in (config.raw_topic, config.reports_topic, config.shuffled_topic):
        plan = plan_bounded_read(broker.bootstrap, topic, config.group_id)
        assert plan and all(r.start == r.stop for r in plan), (topic, plan)
    before = read_estimates(config.out_dir)
    again = run(config)
    assert all(s.accounting["read"] == 0 for s in again.stages.values()), again.accounting
    assert read_estimates(config.out_dir).equals(before)
    # A fresh state directory refuses a consumer group another job has committed for (it may own it) unless
    # told to adopt it, and then starts from the group's committed offsets: still nothing to read.
    fresh = {**config.__dict__, "out_dir": tmp_path, "keys_dir": config.keys}
    with pytest.raises(GroupInUse, match="--adopt_consumer_group"):
        run(JobConfig(**fresh))
    fresh = run(JobConfig(**{**fresh, "adopt_group": True}))
    assert all(s.accounting["read"] == 0 for s in fresh.stages.values()), fresh.accounting
    assert read_estimates(tmp_path).num_rows == 0


def test_deletions_published_only_when_the_spec_allows(broker, tmp_path: Path) -> None:
    """n_deleted is null by default (it would reveal the exact crowd size) and exact when opted in."""
    spec = _spec("grr", publish_deletions=True)
    population = synthesize(spec, 2000, windows=2, seed=4)
    enrol(tmp_path, population)
    topics = {"raw_topic": f"raw-pub-{tmp_path.name}", "reports_topic": f"rep-pub-{tmp_path.name}",
              "shuffled_topic": f"shuf-pub-{tmp_path.name}"}
    produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                       reports_topic=topics["reports_topic"])
    summary = run(JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=tmp_path,
                            group_id=f"g-pub-{tmp_path.name}", seed=8, drain=True, **topics))
    est = read_estimates(tmp_path).to_pydict()
    per_window = {w: d for w, d in zip(est["window_start"], est["n_deleted"], strict=True)}
    assert len(per_window) == 2
    assert sum(per_window.values()) == summary.count("sets_deleted") > 0
    n_by_window = {w: n for w, n in zip(est["window_start"], est["n_clients"], strict=True)}
    truth = truth_table(spec, population).to_pydict()
    for w, deleted in per_window.items():
        crowd = sum(c for ws, c in zip(truth["window_start"], truth["count"], strict=True) if ws == w)
        assert n_by_window[w] + deleted == crowd
    # The second window's odometer composes both releases.
    assert sorted(set(est["windows_composed"])) == [1, 2]
