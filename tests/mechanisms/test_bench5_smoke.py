"""Smoke tests of the range, heavy-hitter and message-size benchmarks (benchmarks/ranges.py, heavy_hitters.py,
messages.py) on tiny inputs, with the project's own dependencies only (the baselines need the ``bench`` extra).

They check the plumbing and the conventions the tables rely on: range answers use [lo, hi) with the
baseline's CDF read the same way, precision/recall count ties as hits, and the Avro sizes add up.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from transforms.mechanisms.randomness import seeded_rng

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench5_{name}", _BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ranges = _load("ranges")
heavy = _load("heavy_hitters")
messages = _load("messages")


def test_ranges_truth_and_baseline_convention() -> None:
    rng = seeded_rng(11)
    x = ranges.make_data(500, 8, rng)
    assert x.min() >= 0 and x.max() < 256
    lo, hi = ranges.random_ranges(50, 8, rng)
    assert np.all(lo < hi) and np.all(hi <= 256) and np.all(lo >= 0)
    brute = np.array([np.sum((x >= a) & (x < b)) for a, b in zip(lo, hi, strict=True)])
    np.testing.assert_array_equal(ranges.true_answers(x, lo, hi), brute)
    # the library's cdf[i] = fraction of clients with leaf <= i: its [lo, hi) counts must equal the truth
    cdf = np.cumsum(np.bincount(x, minlength=256)) / x.size
    np.testing.assert_allclose(ranges.lhm_cdf_answers(cdf, x.size, lo, hi), brute, atol=1e-9)


def test_ranges_ours_accurate_and_calibrated() -> None:
    rng = seeded_rng(12)
    x = ranges.make_data(20_000, 8, rng)
    lo, hi = ranges.random_ranges(100, 8, rng)
    truth = ranges.true_answers(x, lo, hi)
    for levels in ("sample", "all"):
        est, se, _ = ranges.run_ours(x, 8, 4.0, levels, lo, hi, rng)
        m = ranges.metrics(est, truth, x.size, se)
        assert m["mae"] < 0.05, (levels, m)  # a broken answer path is off by O(1) of n
        assert m["in3se"] >= 0.9, (levels, m)
        assert np.isclose(m["mse"], m["rmse"] ** 2)


def test_ranges_grid_and_plot(tmp_path: Path) -> None:
    rows = ranges.run_grid([3000], [4.0], 8, reps=1, ranges=20, seed=3, with_baseline=False)
    assert {r["method"] for r in rows} == set(ranges.OURS)
    assert all(np.isfinite(r["mae"]) and r["seconds"] > 0 for r in rows)
    ranges.plot(rows, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_heavy_hitters_score_counts_ties() -> None:
    items = np.array([5] * 10 + [6] * 7 + [7] * 7 + [8] * 2, dtype=np.uint64)
    found = np.array([5, 7, 8], dtype=np.uint64)
    s = heavy.score(found, np.array([11.0, 7.0, 1.0]), items, k=2)  # 6 and 7 tie for 2nd: 7 is a hit
    assert s["precision"] == 2 / 3 and s["recall"] == 1.0
    assert np.isclose(s["relerr"], np.median([0.1, 0.0]))


def test_heavy_hitters_ours_finds_dominant_items() -> None:
    rng = seeded_rng(13)
    items = heavy.zipf_items(20_000, 1.5, 12, rng)
    assert items.dtype == np.uint64 and int(items.max()) < 2**heavy.ITEM_BITS
    (found, t_client, t_server), = heavy.run_ours(items, 6.0, [3], 4, rng)
    s = heavy.score(*found[3], items, 3)
    assert s["recall"] == 1.0 and t_client > 0 and t_server > 0, s


def test_messages_sizes_add_up() -> None:
    rng = seeded_rng(14)
    envelope = messages.envelope_bytes()
    grr = messages.GRR(1024, 1.0)
    m = messages.measure("hist", grr, 10_000, 200, rng)
    assert m["expected"] == m["measured"] == 1.0
    assert np.isclose(m["avro"], envelope - 2 + m["payload"])  # single message, no presence marker
    dyadic = messages.DyadicRange(8, 2.0, levels="all")
    m = messages.measure("range", dyadic, 10_000, 400, rng)
    assert m["expected"] == m["measured"] == 8.0
    assert m["avro"] > envelope * 9 - 1  # 8 messages + presence marker, each a whole Report
    rappor = messages.AttributeFragmentedRappor(256, 2.0)
    m = messages.measure("hist", rappor, 10_000, 2000, rng)
    assert 2.0 * m["expected"] <= m["payload"] <= 3.0 * m["expected"]  # channel varint + union branch only
    assert abs(m["measured"] - m["expected"]) < 0.2 * m["expected"]
