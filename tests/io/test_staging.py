"""Staging in batches: few files per bundle, every element loaded once, retried bundles add no copies."""

from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from transforms.io.staging import (
    FORMAT,
    StageFn,
    StagingError,
    iter_staged,
    iter_staged_entries,
    load_staged,
    stable_name,
    staged_entries,
    write_batch,
)


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
    import transforms.io.staging as staging

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
    (second,) = [p for p in tmp_path.glob("part-*.pkl") if staged_entries(str(p))[0].name == names[7]]
    second.unlink()
    with pytest.raises(StagingError, match="damaged"):
        list(loader)


def test_headers_are_read_without_the_elements_and_an_element_alone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver decides from a part's header, then reads that part's byte range only, never its neighbours."""
    import transforms.io.staging as staging

    monkeypatch.setattr(staging, "KEEP_IN_MEMORY", 1000)
    elements = {f"e{i}": ("elem", i, bytes([i]) * 5000) for i in range(4)}  # "large": 5 kB each
    fn = StageFn(str(tmp_path), "part", lambda e: f"e{e[1]}", header_of=lambda e: ("head", e[1]))
    fn.start_bundle()
    for element in elements.values():
        fn.process(element)
    fn.finish_bundle()
    (path,) = tmp_path.glob("part-*.pkl")
    reads: list[int] = []
    real = staging._open

    def counting(name: str):  # type: ignore[no-untyped-def]
        handle = real(name)
        read = handle.read
        handle.read = lambda *size: reads.append(len(data := read(*size))) or data  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(staging, "_open", counting)
    entries = list(iter_staged_entries(tmp_path, "part"))
    assert [(e.name, e.header) for e in entries] == [(f"e{i}", ("head", i)) for i in range(4)]
    assert sum(reads) < 1000  # the index only: no element was read
    reads.clear()
    assert entries[2].load() == elements["e2"]
    assert sum(reads) == entries[2].size < path.stat().st_size // 3
    path.write_bytes(path.read_bytes()[:entries[3].start + 10])  # truncated inside the last element
    with pytest.raises(StagingError, match="damaged: truncated"):
        entries[3].load()


def test_small_elements_are_kept_from_the_listing_and_version_1_files_still_load(tmp_path: Path) -> None:
    """A staging location can outlive an upgrade (the streaming shuffler's): files of version 1 still load."""
    old = [(stable_name(i), pickle.dumps(("old", i))) for i in range(3)]
    (tmp_path / "part-v1.pkl").write_bytes(pickle.dumps({"format": FORMAT, "version": 1, "items": old}))
    write_batch(tmp_path, "part", [(stable_name(i), pickle.dumps(("new", i))) for i in range(2, 5)],
                headers={stable_name(4): "four"})
    entries = list(iter_staged_entries(tmp_path, "part"))
    assert all(e.data is not None for e in entries)  # small: held, not read again
    for path in tmp_path.glob("part-*.pkl"):
        path.unlink()
    values = {e.name: e.load() for e in entries}
    assert values[stable_name(2)] in {("old", 2), ("new", 2)}  # one copy per name (a retry's copy is the same)
    assert {values[stable_name(i)] for i in (0, 1, 3, 4)} == {("old", 0), ("old", 1), ("new", 3), ("new", 4)}
    headers = {e.name: e.header for e in entries}
    assert headers[stable_name(4)] == "four" and headers[stable_name(3)] is None and headers[stable_name(0)] is None
