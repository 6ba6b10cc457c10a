"""The one-pipeline job on Beam's portable runner: the path Flink and Dataflow take.

The in-process FnApiRunner that ``esa run`` uses by default executes the pipeline in the submitting process.
On Flink or Dataflow the same pipeline is translated to the portable Runner API, submitted to a job service
over gRPC, and executed by SDK harness processes that unpickle every DoFn and CombineFn. This test runs
that path locally: Beam's Python job service (a subprocess) with a LOOPBACK harness (workers in this
process) and with an EXTERNAL worker pool (``worker_pool_main``: separate SDK worker processes, as in a
Flink TaskManager's or a Dataflow VM's harness container). It checks that the estimates are *identical*
to the in-process run on the same topic data: with a fixed seed every random draw (encoder PRF, shuffler
PRF) is a function of the record and the crowd, never of the runner's bundling, so any difference would
be a real portability bug (state carried in a module global, an unpicklable closure, a bundle-order
dependency).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.end_to_end import ChainSummary, run
from pipelines.enrolment import enrol_simulated
from pipelines.job_config import JobConfig
from tests.deploy.portable import local_job_service, portable_options, worker_pool
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates

pytestmark = pytest.mark.slow

N_CLIENTS = 10_000
SEED = 17
# Every column a consumer reads; all must be bit-identical across runners.
COLUMNS = ("spec_id", "window_start", "window_end", "crowd_id", "item", "item_index", "estimate", "stderr",
           "raw_estimate", "n_reports", "n_clients", "eps_local", "eps_central", "delta", "mechanism")


def _spec() -> object:
    return spec_from_dict({
        "analysis": {"name": "portable_olh", "metric": "portable_olh"},
        "domain": {"size": 16},
        "mechanism": {"name": "olh", "epsilon": 3.0},
        "window": {"size_seconds": 3600},
        "crowd": {"epsilon": 1.0, "delta": 1e-6},
        "privacy": {"delta": 1e-6},
    }, source="test_portable_runner")


def _rows(summary: ChainSummary) -> list[tuple]:
    table = read_estimates(summary.out_dir).to_pydict()
    return sorted(zip(*(table[c] for c in COLUMNS), strict=True), key=lambda r: (r[1], r[5]))


@pytest.fixture(scope="module")
def produced(broker, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One population on two fresh topics, and the in-process reference run over them."""
    spec = _spec()
    stem = f"portable-{int(time.time() * 1000)}"
    window_ms = spec.window_seconds * 1000
    start_ms = (int(time.time() * 1000) // window_ms - 4) * window_ms  # recent, closed windows
    population = synthesize(spec, N_CLIENTS, windows=2, start_ms=start_ms, seed=SEED)
    base = tmp_path_factory.mktemp("portable")
    enrol_simulated(base / "keys", population.client_ids.tolist())
    produce_population(broker.bootstrap, spec, population, bad_per_kind=1, seed=SEED, raw_topic=f"{stem}-raw",
                       reports_topic=f"{stem}-bad")

    def config(name: str) -> JobConfig:
        # Each runner reads the same raw records through its own consumer group, and keeps its own
        # intermediate topics and state; all share the keys (the same enrolled devices).
        return JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=base / name, keys_dir=base / "keys",
                         raw_topic=f"{stem}-raw", reports_topic=f"{stem}-{name}-rep",
                         shuffled_topic=f"{stem}-{name}-shuf", group_id=f"{stem}-{name}", seed=SEED, drain=True)

    started = time.perf_counter()
    reference = run(config("fnapi"))
    seconds = time.perf_counter() - started
    print(f"FnApiRunner in process: {seconds:.1f} s")
    return {"config": config, "reference": reference, "base": base}


def _check_same_as_reference(produced: dict, summary: ChainSummary) -> None:
    reference = produced["reference"]
    assert summary.balanced, summary.accounting
    assert summary.accounting == reference.accounting
    rows, expected = _rows(summary), _rows(reference)
    assert len(expected) == 2 * 16  # two windows x 16 items
    assert rows == expected


def test_portable_runner_loopback_matches_in_process(produced: dict) -> None:
    with local_job_service(produced["base"]) as endpoint:
        started = time.perf_counter()
        summary = run(produced["config"]("loopback"), portable_options(endpoint, "LOOPBACK"))
        print(f"PortableRunner LOOPBACK: {time.perf_counter() - started:.1f} s")
    _check_same_as_reference(produced, summary)


def test_portable_runner_external_worker_pool_matches_in_process(produced: dict) -> None:
    log_dir: Path = produced["base"]
    with local_job_service(log_dir) as endpoint, worker_pool(log_dir) as pool:
        started = time.perf_counter()
        summary = run(produced["config"]("external"), portable_options(endpoint, "EXTERNAL", pool))
        print(f"PortableRunner EXTERNAL worker pool: {time.perf_counter() - started:.1f} s")
    _check_same_as_reference(produced, summary)
