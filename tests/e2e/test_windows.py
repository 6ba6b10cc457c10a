"""Event-time windows across runs of the chain, with a pinned clock (what Beam's panes used to decide).

A window is held while the watermark (max authenticated event time minus the out-of-orderness) has not
passed its end plus the allowed lateness; it is released exactly once, by the first run whose watermark
passes it; sets that arrive for it afterwards are dead-lettered as late and never change its estimates;
``drain`` closes every window.
"""

from __future__ import annotations

import time

import fastavro
import pytest

from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.end_to_end import run
from pipelines.job_config import JobConfig, default_state_dir
from tests.e2e.chain import enrol
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates

W = 600_000  # window length, ms
N = 2000


@pytest.fixture(scope="module")
def runs(broker, tmp_path_factory: pytest.TempPathFactory):
    spec = spec_from_dict({
        "analysis": {"name": "windows", "metric": "windows"}, "domain": {"size": 8},
        "mechanism": {"name": "grr", "epsilon": 3.0},
        "window": {"size_seconds": W // 1000, "allowed_lateness_seconds": 0},
    }, source="test")
    out = tmp_path_factory.mktemp("windows")
    base = (int(time.time() * 1000) // W - 10) * W  # window A = [base, base + W); window C = [base + 2W, base + 3W)
    topics = {"raw_topic": f"win-raw-{out.name}", "reports_topic": f"win-rep-{out.name}",
              "shuffled_topic": f"win-shuf-{out.name}"}

    def produce(n: int, start_ms: int, seed: int) -> None:
        population = synthesize(spec, n, start_ms=start_ms, seed=seed)
        enrol(out, population)
        produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                           reports_topic=topics["reports_topic"])

    def chain(now_ms: int, drain: bool = False):
        config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out, group_id=f"win-{out.name}",
                           seed=3, now_ms=now_ms, out_of_orderness_seconds=60, drain=drain, **topics)
        return run(config), read_estimates(out)

    produce(N, base, seed=1)
    summaries = [chain(base + 2 * W)]  # A's own events cannot move the watermark past A's end
    produce(N, base + 2 * W, seed=2)
    summaries.append(chain(base + 3 * W))  # C's events close A; C stays open
    produce(N // 4, base, seed=3)
    summaries.append(chain(base + 3 * W))  # late sets for A; C still open
    summaries.append(chain(base + 3 * W, drain=True))  # drain closes C
    return spec, base, out, summaries


def test_an_open_window_is_held_not_released(runs) -> None:
    _, _, _, summaries = runs
    summary, estimates = summaries[0]
    shuffle = summary.stages["shuffle"].accounting
    assert summary.balanced and shuffle["held"] == N and shuffle["released"] == shuffle["deleted"] == 0
    assert summary.stages["shuffle"].count("signatures_verified_before") == 0
    assert summary.stages["analyze"].accounting["read"] == 0 and estimates.num_rows == 0


def test_a_window_is_released_once_when_the_watermark_passes_it(runs) -> None:
    spec, base, _, summaries = runs
    summary, estimates = summaries[1]
    shuffle = summary.stages["shuffle"]
    s = shuffle.accounting
    # The held sets of A are read again (resume offsets never pass a held record) and now released; C's held.
    assert summary.balanced and s["read"] == 2 * N and s["held"] == N and s["deleted"] + s["released"] == N
    # ... and their signatures are not checked again: the first run recorded what it verified.
    assert shuffle.count("signatures_verified_before") == N
    assert [sm.stages["shuffle"].count("signatures_verified_before") for sm, _ in summaries[2:]] == [N, N + N // 4]
    assert shuffle.extra["releases"] == 1 and summary.stages["analyze"].accounting["analyzed"] >= 1
    assert set(estimates["window_start"].to_pylist()) == {base} and estimates.num_rows == spec.d
    assert set(estimates["n_clients"].to_pylist()) == {s["released"]}


def test_late_sets_are_dead_lettered_and_change_nothing(runs) -> None:
    _, base, out, summaries = runs
    (_, released), (summary, estimates) = summaries[1], summaries[2]
    shuffle = summary.stages["shuffle"]
    s = shuffle.accounting
    assert summary.balanced and s["read"] == N // 4 + N and s["held"] == N
    assert s["dead_lettered"] == shuffle.count("sets_late") == N // 4 and s["released"] == 0
    assert summary.stages["analyze"].accounting["read"] == 0 and estimates.equals(released)
    letters = []
    for path in (default_state_dir(out) / "shuffle" / "dead_letters").glob("dead-letters-*.avro"):
        with path.open("rb") as f:
            letters.extend(fastavro.reader(f))
    late = [d for d in letters if d["reason"] == "late: its window was already released"]
    assert len(late) == N // 4 and all(d["original"] for d in late)
    assert len(list((out / "estimates").rglob(f"window_end_ms={base + W}/*.parquet"))) == 1


def test_drain_closes_the_open_window_and_leaves_the_released_one_alone(runs) -> None:
    spec, base, _, summaries = runs
    (_, before), (summary, estimates) = summaries[2], summaries[3]
    s = summary.stages["shuffle"].accounting
    assert summary.balanced and s["held"] == 0 and s["deleted"] + s["released"] == N
    # Resuming at C's first held record reads the late sets behind it again: skipped, not dead-lettered twice.
    assert s["read"] == N + N // 4 and s["reread"] == N // 4 and s["dead_lettered"] == 0
    assert sorted(set(estimates["window_start"].to_pylist())) == [base, base + 2 * W]
    assert estimates.filter(estimates["window_start"].to_numpy() == base).equals(before)
    assert sorted(set(estimates["windows_composed"].to_pylist())) == [1, 2] and estimates.num_rows == 2 * spec.d

