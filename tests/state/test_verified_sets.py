"""The shuffler's record of verified signatures: exact lookups, pruning, and a file that can only help."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from transforms.state.verified_sets import FILE_NAME, VerifiedSets


def digest(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def batch(pkey: str, offsets: list[int]) -> tuple[str, np.ndarray, np.ndarray]:
    return pkey, np.array(offsets), np.frombuffer(b"".join(digest(o) for o in offsets), dtype=np.uint8)


def test_lookup_needs_same_partition_offset_and_bytes() -> None:
    cache = VerifiedSets().merged([batch("t/0", [5, 1, 9]), batch("t/1", [2])], keep_from={})
    assert len(cache) == 4
    assert cache.contains("t/0", 5, digest(5)) and cache.contains("t/1", 2, digest(2))
    assert not cache.contains("t/0", 5, digest(6))  # other bytes at that offset: a different record
    assert not cache.contains("t/0", 6, digest(6)) and not cache.contains("t/0", 10, digest(10))
    assert not cache.contains("t/2", 5, digest(5)) and not cache.contains("t/1", 5, digest(5))


def test_merge_keeps_one_entry_per_offset_and_drops_what_is_never_read_again() -> None:
    first = VerifiedSets().merged([batch("t/0", [1, 2, 3])], keep_from={})
    second = first.merged([batch("t/0", [3, 4]), batch("t/1", [7])], keep_from={"t/0": 3, "t/1": 8})
    assert list(second.offsets["t/0"]) == [3, 4] and "t/1" not in second.offsets
    assert second.contains("t/0", 3, digest(3)) and not second.contains("t/0", 2, digest(2))


def test_save_load_round_trip_and_damaged_files_are_empty(tmp_path: Path) -> None:
    cache = VerifiedSets().merged([batch("topic-a/0", list(range(0, 100, 3))), batch("b/2", [1])], keep_from={})
    cache.save(tmp_path)
    loaded = VerifiedSets.load(tmp_path)
    assert len(loaded) == len(cache) and loaded.contains("topic-a/0", 99, digest(99)) and loaded.contains("b/2", 1,
                                                                                                          digest(1))
    assert len(VerifiedSets.load(tmp_path / "missing")) == 0
    (tmp_path / FILE_NAME).write_bytes((tmp_path / FILE_NAME).read_bytes()[:50])  # torn write
    assert len(VerifiedSets.load(tmp_path)) == 0
    (tmp_path / FILE_NAME).write_bytes(b"not a zip at all")
    assert len(VerifiedSets.load(tmp_path)) == 0
