"""Staging in batches: few files per bundle, every element loaded once, retried bundles add no copies."""

from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from transforms.staging import StageFn, StagingError, iter_staged, load_staged, stable_name, write_batch


def test_a_pipeline_stages_many_elements_in_few_files(tmp_path: Path) -> None:
    elements = [(f"k{i}", i * i) for i in range(5000)]
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = (p | beam.Create(elements)
             | beam.ParDo(StageFn(str(tmp_path), "time", lambda kv: stable_name(kv[0]), max_elements=1000)))
    files = list(tmp_path.glob("time-*.pkl"))
    assert 5 <= len(files) <= 50  # bounded by max_elements per file, not one file per element
    loaded = load_staged(tmp_path, "time")
    assert sorted(loaded) == sorted(elements)
    assert loaded == sorted(elements, key=lambda kv: stable_name(kv[0]))  # deterministic: element-name order
    assert not list(tmp_path.glob(".*"))  # no temporary litter


def test_a_retried_bundle_grouped_differently_adds_no_copies(tmp_path: Path) -> None:
    named = [(stable_name(i), pickle.dumps(("elem", i))) for i in range(10)]
    write_batch(tmp_path, "part", named[:6])  # first attempt
    write_batch(tmp_path, "part", named[3:])  # retry, split differently, overlapping
    write_batch(tmp_path, "part", named[:6])  # the same batch again: the same file, replaced
    assert len(list(tmp_path.glob("part-*.pkl"))) == 2
    assert sorted(load_staged(tmp_path, "part")) == [("elem", i) for i in range(10)]
    assert write_batch(tmp_path, "part", []) is None
    assert load_staged(tmp_path, "held") == []


def test_foreign_or_damaged_files_are_errors(tmp_path: Path) -> None:
    (tmp_path / "part-old.pkl").write_bytes(pickle.dumps(("an", "unversioned", "element")))
    with pytest.raises(StagingError, match="not a staged batch"):
        load_staged(tmp_path, "part")
    (tmp_path / "part-old.pkl").write_bytes(pickle.dumps({"format": "esa-staged-batch", "version": 99, "items": []}))
    with pytest.raises(StagingError, match="version 99"):
        list(iter_staged(tmp_path, "part"))
    (tmp_path / "part-old.pkl").write_bytes(b"\x80\x05garbage")
    with pytest.raises(StagingError, match="damaged"):
        load_staged(tmp_path, "part")
