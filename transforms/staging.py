"""Staging: what a pipeline run hands to its driver, written atomically into the run's staging directory.

The driver acts on staged results only after the whole pipeline succeeded (seal, publish, commit), so a
run that dies leaves nothing visible outside its staging directory. Elements are staged in *batches*, a
few files per bundle rather than one per element (20,000 closed windows used to cost 20,000 files, each
fsynced): a batch file holds (name, pickled element) pairs, its own name is a digest of its element names,
and the loader keeps one element per name. Names are derived from the element (not from the bundle), so a
retried bundle -- grouped the same or differently -- adds no second copy of anything.

Staging files are not fsynced: a crashed run's staging directory is deleted and redone by the next attempt
(``pipelines.job.plan_run``), and everything durable (release files, the ledger, the run state) is written
by the driver with its own fsyncs. A rename still makes each file appear whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam

FORMAT = "esa-staged-batch"
VERSION = 1
MAX_BATCH_BYTES = 8 << 20  # flush a bundle's buffer past this many pickled bytes (bounded worker memory)
MAX_BATCH_ELEMENTS = 50_000  # ... or this many elements


class StagingError(RuntimeError):
    """A staged file that this version cannot read (another format, or damaged)."""


def stable_name(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def write_batch(directory: Path | str, prefix: str, named: Iterable[tuple[str, bytes]]) -> Path | None:
    """Write (name, pickled element) pairs as one file ``<prefix>-<digest of names>.pkl``; None if empty.

    Write to a hidden temporary file, then rename: a reader never sees a partial batch.
    """
    items = sorted(named)
    if not items:
        return None
    digest = hashlib.sha256("\n".join(name for name, _ in items).encode()).hexdigest()[:24]
    path = Path(directory) / f"{prefix}-{digest}.pkl"
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    data = pickle.dumps({"format": FORMAT, "version": VERSION, "items": items}, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    return path


class StageFn(beam.DoFn):
    """Stage elements in batches of a bundle (see the module doc); ``name_of`` names an element stably."""

    def __init__(self, directory: str, prefix: str, name_of: Callable[[Any], str],
                 max_bytes: int = MAX_BATCH_BYTES, max_elements: int = MAX_BATCH_ELEMENTS):
        self._directory, self._prefix, self._name_of = directory, prefix, name_of
        self._max_bytes, self._max_elements = max_bytes, max_elements
        self._buffer: list[tuple[str, bytes]] = []
        self._bytes = 0

    def start_bundle(self) -> None:
        self._buffer, self._bytes = [], 0

    def process(self, element: Any) -> Iterator[None]:
        data = pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL)
        self._buffer.append((self._name_of(element), data))
        self._bytes += len(data)
        if self._bytes >= self._max_bytes or len(self._buffer) >= self._max_elements:
            self._flush()
        return iter(())

    def finish_bundle(self) -> None:
        self._flush()

    def _flush(self) -> None:
        write_batch(self._directory, self._prefix, self._buffer)
        self._buffer, self._bytes = [], 0


def _read_batch(path: Path) -> list[tuple[str, bytes]]:
    try:
        obj = pickle.loads(path.read_bytes())
    except Exception as err:  # any unpickling failure: the file is not what this run staged
        raise StagingError(f"staged file {path} is damaged: {err}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise StagingError(f"staged file {path} is not a staged batch (format {FORMAT!r})")
    if obj.get("version") != VERSION:
        raise StagingError(f"staged file {path} has version {obj.get('version')!r}; this esa reads {VERSION}")
    return obj["items"]


def iter_staged(directory: Path, prefix: str) -> Iterator[Any]:
    """Every element staged under ``prefix``, once each, in element-name order (deterministic).

    Elements are unpickled one at a time, so a caller that consumes them as it goes holds one at a time.
    """
    by_name: dict[str, bytes] = {}
    for path in sorted(Path(directory).glob(f"{prefix}-*.pkl")):
        for name, data in _read_batch(path):
            by_name.setdefault(name, data)  # a retried bundle's copy: the same element by construction
    for name in sorted(by_name):
        yield pickle.loads(by_name.pop(name))


def load_staged(directory: Path, prefix: str) -> list[Any]:
    """Every element staged under ``prefix``, once each, in element-name order (deterministic)."""
    return list(iter_staged(directory, prefix))
