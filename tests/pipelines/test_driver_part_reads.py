"""The shuffler's drivers read staged release parts sparingly: each part's messages are read once, by the
release writer (never to group parts into releases or to find withheld windows: the staged headers say), the
driver holds one part at a time, and the release file is byte-identical to one written from the parts in
memory. Messages of varying sizes need the writer's two passes (each part read twice at most).

Counted on the files themselves (bytes read from staged part files) and on the parts' messages as they are
unpickled (how many, how many alive at once), so the counts hold whatever the loader looks like.
"""

from __future__ import annotations

import builtins
import io
import pickle
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transforms.io.staging as staging
import transforms.shuffler.packed as packed
import transforms.shuffler.release_step as driver
from pipelines.job import BoundedRun
from pipelines.job_config import JobConfig
from pipelines.shuffle import seal_run
from pipelines.targets import release_target
from schemas import encode_record  # noqa: F401  (schemas before trust's encoders)
from transforms.io.kafka.bounded import PartitionRange
from transforms.io.staging import write_batch
from transforms.shuffler.graph import PartHeader, ReleasePart, part_header
from transforms.shuffler.packed import PackedMessages
from transforms.shuffler.release_agent import ReleaseAgent
from transforms.shuffler.release_files import batch_bounds_of, message_bytes, uniform_batch_bounds, write_release
from transforms.shuffler.streaming import MARKER, StagedRelease, StagePartFn, release_dir
from transforms.spec import load_spec
from transforms.state.ledger import ReleaseKey, ReleaseLedger
from transforms.state.run_state import RunState
from transforms.trust.keys import init_keys, load_shuffler_signer

SPEC = load_spec(Path(__file__).resolve().parents[2] / "examples" / "app_language.toml")
END = 1_800_000_000_000 // 3_600_000 * 3_600_000
N_PARTS, PER_PART, WIDTH = 3, 2000, 40  # 80 kB of payload per part: "large" below (KEEP_IN_MEMORY 10 kB)


@dataclass
class PartReads:
    """Bytes read from staged part files; parts' messages unpickled, and the most alive at once."""

    root: Path
    bytes_read: int = 0
    loads: int = 0
    alive: int = 0
    max_alive: int = 0
    published: list[str] = field(default_factory=list)

    def opened(self, path: Any, handle: Any) -> Any:
        if not (str(path).startswith(str(self.root)) and Path(path).name.startswith("part-")):
            return handle
        read = handle.read

        def counted(*size: int) -> bytes:
            data = read(*size)
            self.bytes_read += len(data)
            return data

        handle.read = counted
        return handle

    def restored(self, messages: PackedMessages) -> PackedMessages:
        self.loads += 1
        self.alive += 1
        self.max_alive = max(self.max_alive, self.alive)
        weakref.finalize(messages.offsets, self._died)  # PackedMessages has no weakref slot; its arrays do
        return messages

    def _died(self) -> None:
        self.alive -= 1


@pytest.fixture
def reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PartReads]:
    counts = PartReads(tmp_path / "staging")
    real_open, real_restore = io.open, packed._restore_messages

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        return counts.opened(path, real_open(path, *args, **kwargs))

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    def restore(*args: Any) -> PackedMessages:
        return counts.restored(real_restore(*args))

    # Pickled messages name their restorer (``PackedMessages.__reduce__``): the counting one stands in its place.
    restore.__module__, restore.__qualname__ = real_restore.__module__, real_restore.__qualname__
    monkeypatch.setattr(packed, "_restore_messages", restore)
    monkeypatch.setattr(staging, "KEEP_IN_MEMORY", 10_000)
    monkeypatch.setattr(driver, "publish", lambda target, release_id, path: counts.published.append(release_id))
    yield counts


def _config(tmp_path: Path) -> JobConfig:
    init_keys(tmp_path / "keys")
    return JobConfig(bootstrap="127.0.0.1:1", specs=(SPEC,), out_dir=tmp_path / "out", state_dir=tmp_path / "state",
                     keys_dir=tmp_path / "keys", shuffled_topic="never-written")


def _parts(uniform: bool = True) -> list[ReleasePart]:
    """Parts of one release; ``uniform``: every payload of one length (sealed payloads are padded), else not."""
    rng = np.random.default_rng(7)
    parts = []
    for k in range(N_PARTS):
        lengths = np.full(PER_PART, WIDTH) if uniform else rng.integers(WIDTH // 2, WIDTH * 2, PER_PART)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        parts.append(ReleasePart(SPEC.spec_id, None, END, k, PackedMessages(
            rng.integers(0, 3, PER_PART).astype(np.int32), offsets, rng.bytes(int(offsets[-1]))), PER_PART, 5))
    return parts


def _stage_bounded(root: Path, parts: list[ReleasePart]) -> int:
    """Stage as a run does (one bundle: the parts share one batch file); the bytes staged."""
    root.mkdir()
    stager = driver.part_stager(str(root))
    stager.start_bundle()
    for part in parts:
        stager.process(part)
    stager.finish_bundle()
    return _staged_bytes(root)


def _digest_in_memory(config: JobConfig, parts: list[ReleasePart], tmp_path: Path) -> str:
    """The digest of the release written from the parts held in memory (the reference bytes)."""
    written = write_release(tmp_path / "reference", parts, *load_shuffler_signer(config.keys))
    written.discard()
    return written.digest


def _staged_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("part-*.pkl"))


@pytest.mark.parametrize("uniform", [True, False], ids=["padded", "varying"])
def test_the_bounded_driver_reads_each_part_once_in_the_release_writer(tmp_path: Path, reads: PartReads,
                                                                       uniform: bool) -> None:
    config, parts = _config(tmp_path), _parts(uniform)
    expected = _digest_in_memory(config, parts, tmp_path)
    reads.loads = 0
    root = tmp_path / "staging"
    staged = _stage_bounded(root, parts)
    del parts
    run = BoundedRun(config, "shuffle", "reports", RunState(), [PartitionRange("reports", 0, 0, 99)], "k1", root,
                     END + 10)
    ledger = ReleaseLedger(config.state / "ledger")
    assert seal_run(run, ledger) == (1, 0)
    entry = ledger.get(ReleaseKey(SPEC.spec_id, None, END))
    assert entry is not None and entry.digest == expected and reads.published == [entry.release_id]
    # Padded payloads: the layout comes from the headers, each part is read once. Varying ones: the writer's
    # two passes read each part but the first twice (see write_release). Nothing else reads a part's messages;
    # before the staged index, each of five loads per part read its whole batch file.
    assert reads.loads == (N_PARTS if uniform else 2 * N_PARTS - 1)
    assert reads.bytes_read <= (1 if uniform else 2) * staged
    assert reads.max_alive == 1


def test_the_release_agent_holds_one_part_at_a_time(tmp_path: Path, reads: PartReads) -> None:
    config, parts = _config(tmp_path), _parts()
    expected = _digest_in_memory(config, parts, tmp_path)
    reads.loads = 0
    root = str(tmp_path / "staging")
    stage = StagePartFn(root)
    for part in parts:
        list(stage.process(part))
    directory = release_dir(root, parts[0])
    marker = StagedRelease((SPEC.spec_id, None, END), tuple(range(N_PARTS)), {"reports/0": 77})
    write_batch(directory, MARKER, [(MARKER, pickle.dumps(marker))])
    del parts, part
    staged = _staged_bytes(tmp_path / "staging")
    agent = ReleaseAgent(release_target(config), config.specs, ReleaseLedger(config.state / "ledger"), root,
                         "stream-test")
    assert agent.step() == 1 and agent.totals.released == 1
    entry = agent._ledger.get(ReleaseKey(SPEC.spec_id, None, END))
    assert entry is not None and entry.digest == expected
    assert reads.max_alive == 1  # before: every part of the release loaded at once
    assert reads.loads == N_PARTS
    assert reads.bytes_read <= staged


def test_a_withheld_window_is_found_without_reading_any_part(tmp_path: Path, reads: PartReads,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers alone decide: withheld parts are tiny anyway, so any load of one here means a header was ignored."""
    config = _config(tmp_path)
    root = tmp_path / "staging"
    root.mkdir()
    loaded: list[str] = []
    real_load = staging.StagedEntry.load
    monkeypatch.setattr(staging.StagedEntry, "load", lambda self: loaded.append(self.name) or real_load(self))
    stager = driver.part_stager(str(root))
    stager.start_bundle()
    for k in (0, 3):
        stager.process(ReleasePart(SPEC.spec_id, None, END, k, (), 0, None))
    stager.finish_bundle()
    run = BoundedRun(config, "shuffle", "reports", RunState(), [PartitionRange("reports", 0, 0, 9)], "k1", root,
                     END + 10)
    ledger = ReleaseLedger(config.state / "ledger")
    assert seal_run(run, ledger) == (0, 0)
    entry = ledger.get(ReleaseKey(SPEC.spec_id, None, END))
    assert entry is not None and entry.digest == "withheld" and loaded == [] and reads.published == []


def test_parts_staged_without_headers_are_still_released(tmp_path: Path, reads: PartReads) -> None:
    """Parts staged by an earlier esa (no header in the index) are read for their header: same release."""
    config, parts = _config(tmp_path), _parts()
    expected = _digest_in_memory(config, parts, tmp_path)
    root = tmp_path / "staging"
    root.mkdir()
    write_batch(root, "part", [(f"{p.subkey:05d}", pickle.dumps(p)) for p in parts])  # sub-key order
    run = BoundedRun(config, "shuffle", "reports", RunState(), [PartitionRange("reports", 0, 0, 99)], "k1", root,
                     END + 10)
    ledger = ReleaseLedger(config.state / "ledger")
    assert seal_run(run, ledger) == (1, 0)
    entry = ledger.get(ReleaseKey(SPEC.spec_id, None, END))
    assert entry is not None and entry.digest == expected


def test_a_part_that_does_not_match_its_header_is_refused(tmp_path: Path, reads: PartReads) -> None:
    """The layout signed into every batch comes from the headers: a part that differs from its own (a damaged
    staging location) stops the release, and nothing is sealed or left behind."""
    config, parts = _config(tmp_path), _parts()
    root = tmp_path / "staging"
    root.mkdir()
    headers = {f"{p.subkey:05d}": part_header(p) for p in parts}
    headers["00001"] = headers["00001"]._replace(n_messages=PER_PART - 1)
    write_batch(root, "part", [(f"{p.subkey:05d}", pickle.dumps(p)) for p in parts], headers)
    run = BoundedRun(config, "shuffle", "reports", RunState(), [PartitionRange("reports", 0, 0, 99)], "k1", root,
                     END + 10)
    ledger = ReleaseLedger(config.state / "ledger")
    with pytest.raises(ValueError, match="does not match its staged header"):
        seal_run(run, ledger)
    assert ledger.get(ReleaseKey(SPEC.spec_id, None, END)) is None and reads.published == []
    assert not list((config.state / "releases").iterdir())


@pytest.mark.parametrize("width", [1, 40, 63, 64, 200, 300_000, 600_000])
@pytest.mark.parametrize("n", [0, 1, 5000, 30_011])
def test_batch_bounds_from_headers_are_the_greedy_cut(n: int, width: int) -> None:
    """The headers' layout cuts batches exactly where the arrays' greedy cut does (same release bytes)."""
    channels = np.full(n, 2, dtype=np.int32)
    header = PartHeader(SPEC.spec_id, None, END, 0, n, None, n, width if n else None, (2, 2) if n else None)
    size = message_bytes(header)
    assert (size is None) == (n == 0)
    expected = batch_bounds_of(channels, np.full(n, width, dtype=np.int64))
    assert (uniform_batch_bounds(n, size) if size else [(0, 0)]) == expected
    assert message_bytes(header._replace(channels=(-64, 63))) == (size if n else None)  # one varint byte each
    assert message_bytes(header._replace(channels=(0, 64))) is None  # 64 zig-zags to 128: two bytes
    assert message_bytes(header._replace(width=None)) is None
