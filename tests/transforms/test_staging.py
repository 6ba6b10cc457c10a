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


def test_large_elements_are_read_from_their_file_only_when_their_turn_comes(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A release's parts are megabytes each: the loader keeps small elements and reads large ones late."""
    import transforms.staging as staging

    elements = {stable_name(i): ("elem", i, b"x" * (i * 40)) for i in range(12)}
    names = sorted(elements)
    write_batch(tmp_path, "part", [(n, pickle.dumps(elements[n])) for n in names[:7]])
    write_batch(tmp_path, "part", [(n, pickle.dumps(elements[n])) for n in names[7:]])
    expected = [elements[n] for n in names]
    assert load_staged(tmp_path, "part") == expected
    monkeypatch.setattr(staging, "KEEP_IN_MEMORY", 200)  # elements 5.. are "large"
    assert load_staged(tmp_path, "part") == expected
    loader = iter_staged(tmp_path, "part")
    assert next(loader) == expected[0]  # every file listed and indexed; then a large element's file goes
    assert any(elements[n][1] >= 5 for n in names[7:])  # the second file holds a large element
    (second,) = [p for p in tmp_path.glob("part-*.pkl") if pickle.loads(p.read_bytes())["items"][0][0] == names[7]]
    second.unlink()
    with pytest.raises(StagingError, match="damaged"):
        list(loader)
