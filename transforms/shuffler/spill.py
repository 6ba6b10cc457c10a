"""Spilling the shuffler's bulk data to the run's staging location; only small references cross a group-by-key.

Why: Beam's local runner (FnApiRunner) holds a group-by-key's whole input in memory, several times over (the
bundle's encoded output, the grouping table, the re-encoded groups, the next bundle's input), so any data
that travels through a group-by-key costs a multiple of its size per pending report. The shuffler's sets
and stripped units are therefore written to files under the run's staging location (a local directory or
an object store every worker can reach, as for staged results), and what is grouped is a ``SpillRef``:
path, byte range, count and digest of one packed group. A worker that consumes a group reads its ranges
back; memory is bounded by one group (a dedupe bucket, a sub-crowd), not by the run.

Retries: a file is named by the digest of its content and written whole (atomic rename locally, an upload
elsewhere), so a retried bundle writes the same file or a different one, never a mix; a failed attempt's
files are never referenced (Beam uses only committed outputs) and go with the staging location when the
run ends. Each range carries its own digest, checked when read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transforms.io.staging import Location, is_url, join

SPILL_BYTES = 32 << 20  # flush a worker's buffered groups past this many bytes of array data
DIGEST_BYTES = 16


@dataclass(frozen=True, slots=True)
class SpillRef:
    """Where one packed group lies: ``path[start:stop]`` is its pickle; ``count`` its sets or units."""

    path: str
    start: int
    stop: int
    count: int
    digest: bytes


class SpillError(RuntimeError):
    """A spilled range that cannot be read back as written (missing, truncated or damaged file)."""


def count_of(value: Any) -> int:
    """Sets or units in a group value, spilled (``SpillRef``) or not."""
    return value.count if isinstance(value, SpillRef) else len(value)


def load(value: Any) -> Any:
    """A group value as an object: a ``SpillRef`` is read back, a pickled blob unpickled, anything else kept."""
    if isinstance(value, SpillRef):
        data = read_range(value.path, value.start, value.stop)
        if len(data) != value.stop - value.start or hashlib.sha256(data).digest()[:DIGEST_BYTES] != value.digest:
            raise SpillError(f"spilled range {value.path}[{value.start}:{value.stop}] is damaged or truncated")
        return pickle.loads(data)
    if isinstance(value, bytes):
        return pickle.loads(value)
    return value


def read_range(path: str, start: int, stop: int) -> bytes:
    try:
        if not is_url(path):
            with open(path, "rb") as handle:
                handle.seek(start)
                return handle.read(stop - start)
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(start)
            return handle.read(stop - start)
    except OSError as err:
        raise SpillError(f"spilled file {path} cannot be read: {err}") from err


def write_file(directory: Location, data: bytes) -> str:
    """Write ``data`` whole as ``<directory>/<digest>.spill`` (no fsync: a crashed run is redone whole)."""
    path = join(directory, f"{hashlib.sha256(data).hexdigest()[:32]}.spill")
    if not is_url(path):
        Path(directory).mkdir(parents=True, exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        try:
            with open(partial, "wb") as handle:
                handle.write(data)
            os.replace(partial, path)
        except BaseException:  # a full disk must not keep the space it could not finish using
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise
        return path
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)
    return path


class SpillBuffer:
    """Packed groups buffered by key across a worker's calls; ``flush`` writes them as one file.

    Groups of one key are joined with ``merge`` when flushed, so a key costs one reference per file, however
    many calls added to it. ``add`` flushes by itself past ``max_bytes`` and returns what it flushed.
    """

    def __init__(self, directory: Location, merge: Callable[[Sequence[Any]], Any], size: Callable[[Any], int],
                 max_bytes: int = SPILL_BYTES):
        self._directory, self._merge, self._size, self._max = str(directory), merge, size, max_bytes
        self._groups: dict[Hashable, list[Any]] = {}
        self._bytes = 0

    def add(self, key: Hashable, packed: Any) -> list[tuple[Hashable, SpillRef]]:
        self._groups.setdefault(key, []).append(packed)
        self._bytes += self._size(packed)
        return self.flush() if self._bytes >= self._max else []

    def flush(self) -> list[tuple[Hashable, SpillRef]]:
        """Write every buffered group (keys in a stable order) as one file; their references."""
        if not self._groups:
            return []
        blobs: list[tuple[Hashable, bytes, int]] = []
        for key in sorted(self._groups, key=repr):
            merged = self._merge(self._groups[key])
            blobs.append((key, pickle.dumps(merged, protocol=pickle.HIGHEST_PROTOCOL), len(merged)))
        self._groups, self._bytes = {}, 0
        path = write_file(self._directory, b"".join(blob for _, blob, _ in blobs))
        refs, start = [], 0
        for key, blob, count in blobs:
            refs.append((key, SpillRef(path, start, start + len(blob), count,
                                       hashlib.sha256(blob).digest()[:DIGEST_BYTES])))
            start += len(blob)
        return refs
