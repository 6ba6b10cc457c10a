"""Spill files (transforms/shuffler/spill.py): the shuffler's bulk data beside Beam, references through it.

What must hold: a reference reads back exactly what was buffered under its key (joined, when a key was
added several times); a buffer flushes by itself past its size and writes one file per flush, named by
its content (a retried bundle rewrites the same file); damage is detected, never silently read.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from transforms.shuffler.packed import PackedUnits
from transforms.shuffler.spill import SpillBuffer, SpillError, SpillRef, count_of, load


def units(rng: np.random.Generator, n: int) -> PackedUnits:
    return PackedUnits.of([(1, ((0, rng.bytes(60)),)) for _ in range(n)], rng.integers(0, 2**63, n).tolist())


def buffer(tmp_path: Path, max_bytes: int = 1 << 30) -> SpillBuffer:
    return SpillBuffer(tmp_path / "spill", PackedUnits.concat, lambda u: len(u.messages.payload), max_bytes)


def test_references_read_back_what_each_key_received(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    spill = buffer(tmp_path)
    added = {("a", 0): [units(rng, 5), units(rng, 3)], ("a", 1): [units(rng, 4)], ("b", 0): [units(rng, 2)]}
    for key, packs in added.items():
        for p in packs:
            assert spill.add(key, p) == []
    refs = dict(spill.flush())
    assert spill.flush() == []  # nothing left
    assert set(refs) == set(added)
    assert len({r.path for r in refs.values()}) == 1  # one file per flush
    for key, packs in added.items():
        expected = list(PackedUnits.concat(packs))
        assert list(load(refs[key])) == expected
        assert count_of(refs[key]) == len(expected) == count_of(PackedUnits.concat(packs))


def test_a_buffer_flushes_by_itself_past_its_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    spill = buffer(tmp_path, max_bytes=1000)  # 60-byte payloads: the 17th unit crosses it
    flushed = [ref for i in range(40) for ref in spill.add(("k", i % 3), units(rng, 1))]
    flushed += spill.flush()
    files = {ref.path for _, ref in flushed}
    assert len(files) == 3 and sum(ref.count for _, ref in flushed) == 40


def test_the_same_content_gives_the_same_file_and_damage_is_detected(tmp_path: Path) -> None:
    packs = units(np.random.default_rng(3), 6)
    first, second = buffer(tmp_path), buffer(tmp_path)
    first.add("k", packs)
    second.add("k", packs)
    ((_, ref),) = first.flush()
    ((_, again),) = second.flush()
    assert ref == again and len(list(Path(ref.path).parent.iterdir())) == 1
    data = bytearray(Path(ref.path).read_bytes())
    data[ref.start + 40] ^= 1
    Path(ref.path).write_bytes(bytes(data))
    with pytest.raises(SpillError, match="damaged"):
        load(ref)
    with pytest.raises(SpillError, match="cannot be read"):
        load(SpillRef(str(tmp_path / "missing.spill"), 0, 10, 1, b"x" * 16))


def test_values_that_are_not_references_load_as_they_are() -> None:
    packs = units(np.random.default_rng(4), 2)
    assert list(load(pickle.dumps(packs))) == list(packs)
    assert load(packs) is packs
