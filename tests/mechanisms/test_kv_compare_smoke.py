"""Smoke test of the key-value comparison harness (benchmarks/kv_compare.py) on a tiny grid.

Checks the plumbing, not the science: every mechanism appears on both data kinds, every metric is finite and
positive, projected frequencies stay on the simplex, the synthetic data have exactly s distinct keys per user with
uniform inclusion rates, and the headline ratios and table render.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "kv_compare.py"
_spec = importlib.util.spec_from_file_location("kv_compare", _PATH)
assert _spec is not None and _spec.loader is not None
kv_compare = importlib.util.module_from_spec(_spec)
sys.modules["kv_compare"] = kv_compare  # dataclass/pickle lookups need the module registered
_spec.loader.exec_module(kv_compare)

MECHS = (*kv_compare.DEFAULT_MECHANISMS, "pckv-agrr")


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return kv_compare.run_grid([2000], [16], [2], [1.0], MECHS, reps=1, data=("uniform", "skewed"), seed=3)


def test_grid_has_every_mechanism_and_finite_metrics(records: list[dict]) -> None:
    rows = kv_compare.summarise(records)
    assert {(r["data"], r["mechanism"]) for r in rows} == {(k, m) for k in ("uniform", "skewed") for m in MECHS}
    for r in rows:
        for col in kv_compare.COLUMNS:
            assert math.isfinite(r[f"ln_{col}"]), (r["mechanism"], col)
        assert r["reps"] == 1
    for rec in records:
        assert all(rec[c] > 0 for c in kv_compare.COLUMNS)
        assert rec["freq_mae_raw"] <= rec["freq_tve_raw"]
        assert rec["freq_tve_proj"] <= 2 * rec["s"] + 1e-9  # both vectors on the simplex of total s


def test_headline_and_table_render(records: list[dict]) -> None:
    rows = kv_compare.summarise(records)
    heads = kv_compare.headline(rows)
    assert len(heads) == len(kv_compare.HEADLINES)
    assert all(math.isfinite(h["median"]) and h["settings"] == 2 for h in heads)
    assert len(kv_compare.format_table(rows).splitlines()) == 2 + len(rows)


@pytest.mark.parametrize("data", ["uniform", "skewed"])
def test_synthetic_items_have_s_distinct_keys(data: str) -> None:
    items = kv_compare.synthetic_items(500, 12, 5, np.random.default_rng(0), data)
    keys = np.sort(items // 2, axis=1)
    assert items.shape == (500, 5) and items.min() >= 0 and items.max() < 24
    assert np.all(keys[:, 1:] != keys[:, :-1])


def test_uniform_supports_are_uniform() -> None:
    """Floyd's sampler: every key's inclusion rate is s/d (4.5 sigma, 12 keys)."""
    n, d, s = 20000, 12, 5
    keys = kv_compare.uniform_supports(n, d, s, np.random.default_rng(1))
    rate = np.bincount(keys.ravel(), minlength=d) / n
    sigma = math.sqrt((s / d) * (1 - s / d) / n)
    assert np.all(np.abs(rate - s / d) < 4.5 * sigma)
