"""Every ``esa demo --kind`` end to end on the session's real broker, at small sizes.

Each run synthesizes a population with a known truth, produces it (plus bad records of every kind) to
Kafka, runs encode -> shuffle -> analyze and compares. Asserted: the record accounting balances, every
bad record is dead-lettered, estimates are within their error bars (max |error|/stderr below 4.5, a
Bonferroni bound for up to ~100 items at the 1e-3 level), and the picture is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.demo import DEMO_SPECS, run_demo
from pipelines.demo_plots import plot_file_name
from transforms.spec import load_spec

SMALL_GRID = """
[analysis]
name = "small_grid"
kind = "histogram"
metric = "small_grid"
[domain]
grid = [16, 16]
[mechanism]
name = "rappor"
epsilon = 4.0
[postprocess]
method = "simplex"
[crowd]
epsilon = 1.0
delta = 1e-6
partition = "app_version"
"""

CASES = {
    "grid": ("grid", SMALL_GRID, 6000),
    "kv_mean": ("kv_mean", None, 6000),
    "vector_mean": ("vector_mean", None, 6000),
    "multimessage": ("histogram", (Path(DEMO_SPECS["histogram"]).parent / "app_language_multimessage.toml"), 4000),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_demo_kind_end_to_end(case: str, broker: object, tmp_path: Path) -> None:
    kind, spec_source, clients = CASES[case]
    spec_path = None
    if isinstance(spec_source, str):
        spec_path = tmp_path / "spec.toml"
        spec_path.write_text(spec_source)
    elif spec_source is not None:
        spec_path = spec_source
    outcome = run_demo(clients=clients, mechanism=None, epsilon=None, out=tmp_path / "out", spec_path=spec_path,
                       kind=kind, seed=21, bootstrap=broker.bootstrap, bad_per_kind=2)
    facts = outcome.facts
    assert facts["accounting_balanced"], facts["accounting"]
    assert facts["accounting"]["dead_lettered"] >= 2 * 6  # six bad kinds, two of each
    assert facts["items"] > 0
    assert facts["max_abs_error_over_stderr"] < 4.5, facts
    spec = load_spec(spec_path or DEMO_SPECS[kind])
    assert (tmp_path / "out" / plot_file_name(spec)).stat().st_size > 10_000
    if spec.crowd.partition:
        assert facts["crowds"] == 2  # v1 and v2 estimated separately
