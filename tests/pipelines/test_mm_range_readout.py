"""[MultiMsg]'s multi-message range counting (``mm_range``) from an accumulator to stored rows and back.

The analyzer stores only the root and the left children of its tree; the demo's truth, its comparison and
``esa query`` used to assume a full dyadic tree (``prefix_lengths`` on the mechanism, one row per index of
every level) and failed on the example spec.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.demo.checks import kind_checks
from pipelines.demo.population import synthesize, truth_table
from pipelines.demo.run import JOIN_ON, compare
from pipelines.demo.value_laws import leaves_of
from pipelines.query.ranges import answer_quantile, answer_range, trees_of
from transforms.analyzer.estimates import CrowdAccumulator, estimate_rows
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.ranges.left_children_tree import LeftChildrenTree
from transforms.spec import load_spec

SPEC = Path(__file__).resolve().parents[2] / "examples" / "latency_range_multimessage.toml"
N = 2000


@pytest.fixture(scope="module")
def stored() -> dict:
    spec = load_spec(SPEC)
    mechanism = spec.randomizer
    population = synthesize(spec, N, seed=11, start_ms=0)
    messages, _ = mechanism.encode_messages(leaves_of(spec, population.values), seeded_rng(12))
    accumulator = mechanism.new_accumulator()
    accumulator.add(messages, N)
    rows = estimate_rows(spec, None, CrowdAccumulator(accumulator, 0, len(messages)), 0, spec.window_seconds * 1000)
    return {"spec": spec, "live": accumulator.estimate(), "table": pa.Table.from_pylist(rows),
            "truth": truth_table(spec, population)}


def test_stored_rows_rebuild_the_live_tree(stored: dict) -> None:
    (tree,) = trees_of(stored["table"])
    assert isinstance(tree.tree, LeftChildrenTree) and tree.tree.n == N and tree.bits == 8
    live: LeftChildrenTree = stored["live"]
    rng = np.random.default_rng(0)
    ends = np.sort(rng.integers(0, 257, size=(200, 2)), axis=1)
    got, got_se = tree.tree.answers(ends[:, 0], ends[:, 1])
    want, want_se = live.answers(ends[:, 0], ends[:, 1])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(got_se, want_se, rtol=1e-9)
    answer = answer_range(tree, 0.0, 1000.0)  # value units: [0, 1000) ms is leaves [0, 128)
    assert (answer.leaf_lo, answer.leaf_hi) == (0, 128)
    assert answer.estimate == pytest.approx(float(live.answers([0], [128])[0][0]))
    median = answer_quantile(tree, 0.5)
    assert median.ci_low <= median.value <= median.ci_high


def test_demo_truth_and_checks_accept_the_left_children_tree(stored: dict) -> None:
    spec, table, truth = stored["spec"], stored["table"], stored["truth"]
    comparison = compare(table, truth, on=JOIN_ON[spec.kind])
    assert comparison.num_rows == table.num_rows == 256  # root + 255 left children, each with its true count
    facts, evidence = kind_checks(spec, table, comparison, truth, seed=3)
    assert evidence is not None and facts["random_ranges"] == 1000
    # Each range's error is a sum of ~N(0, se^2) node errors: P(|z| > 3) = 0.27 %, i.e. 2.7 of 1000 expected;
    # ranges share nodes, so allow 2 % (a wrong variance or an unscaled truth fails it by far).
    assert facts["fraction_within_3_stderr"] >= 0.98
    assert facts["node_fraction_within_3_stderr"] >= 0.97


def test_esa_query_answers_from_the_stored_parquet(stored: dict, tmp_path: Path, capsys) -> None:
    pq.write_table(stored["table"], tmp_path / "estimates.parquet")
    assert main(["query", "--estimates", str(tmp_path), "--range", "100", "250", "--quantile", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "range [100, 250)" in out and "quantile 0.5" in out
