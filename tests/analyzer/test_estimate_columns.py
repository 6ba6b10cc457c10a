"""The analyst's statistic/key/unit columns, per kind (item names: transforms.analyzer.readout)."""

from __future__ import annotations

import pytest

from transforms.state.estimate_columns import statistic_of, with_analyst_columns


@pytest.mark.parametrize(("kind", "item", "expected"), [
    ("histogram", "en-US", ("frequency", "en-US", "fraction")),
    ("heavy_hitters", "0a1b", ("frequency", "0a1b", "fraction")),
    ("kv_mean", "search:frequency", ("frequency", "search", "fraction")),
    ("kv_mean", "a:b:mean", ("mean", "a:b", "normalised")),  # a key may hold ':'; the statistic is the last part
    ("kv_mean", "maps:conditional_mean", ("conditional_mean", "maps", "value")),
    ("vector_mean", "x", ("mean", "x", "value")),
    ("range", "3/5", ("node_count", "3/5", "clients")),
    ("quantile", "2/1", ("node_count", "2/1", "clients")),
    ("quantile", "quantile:0.99", ("quantile", "0.99", "value")),
])
def test_statistic_key_and_unit(kind: str, item: str, expected: tuple[str, str, str]) -> None:
    assert statistic_of(kind, item) == expected


def test_unknown_names_are_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="kv_mean item"):
        statistic_of("kv_mean", "search")
    with pytest.raises(ValueError, match="unknown analysis kind"):
        statistic_of("pie", "x")


def test_rows_keep_their_fields_and_gain_the_typed_times() -> None:
    row = {"item": "en-US", "window_start": 1_000, "window_end": 2_000, "estimate": 0.5}
    (out,) = with_analyst_columns("histogram", [row])
    assert out == {**row, "window_start_utc": 1_000, "window_end_utc": 2_000, "statistic": "frequency",
                   "key": "en-US", "unit": "fraction"}
