"""The shuffler's memory of signatures it already checked, so a held set re-read by every run is verified once.

Why: a window stays open for its length plus the out-of-orderness, and each bounded run resumes at the
earliest set it holds, so a following shuffler (``--follow``, a run every few seconds) reads an open
window's sets again on every run. Verifying each again costs ~60 microseconds per set and run: a
one-hour window polled every 5 s would verify each set some 700 times. Instead each run records, for
every set it verified, ``(topic/partition, offset, SHA-256 of the set's signed bytes and signature)``, and a
later run that reads a set with the same digest at the same position skips the signature check (it still checks that
the device is enrolled: a revoked device's held sets are refused at once).

Why this is sound: the digest covers every byte the signature check reads (the signed bytes and the
signature, not the envelope or the Avro encoding around them), so a set with an equal digest passes the
same check the verified one passed; a topic writer cannot make a different record hash the same (a
second preimage of SHA-256). A missing, stale or partial file only means verifying again, so the file is
written without ordering constraints, and entries below the partition's resume offset (never read again)
are dropped at each save: the file holds what the open windows hold, ~40 bytes per set.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transforms.state.files import atomic_write_bytes

DIGEST_BYTES = 32
FILE_NAME = "verified_sets.npz"


@dataclass(frozen=True)
class VerifiedSets:
    """Per ``topic/partition``: sorted offsets and the digests of the records verified at them."""

    offsets: Mapping[str, np.ndarray] = field(default_factory=dict)  # int64, sorted, unique
    digests: Mapping[str, np.ndarray] = field(default_factory=dict)  # uint8 (n, 32), row i for offsets[i]

    def __len__(self) -> int:
        return sum(len(v) for v in self.offsets.values())

    def contains(self, pkey: str, offset: int, digest: bytes) -> bool:
        """Whether exactly this record (same position, same bytes) was verified before."""
        offsets = self.offsets.get(pkey)
        if offsets is None or not len(offsets):
            return False
        i = int(np.searchsorted(offsets, offset))
        return i < len(offsets) and int(offsets[i]) == offset and self.digests[pkey][i].tobytes() == digest

    def merged(self, batches: Iterable[tuple[str, np.ndarray, np.ndarray]], keep_from: Mapping[str, int]
               ) -> VerifiedSets:
        """These entries plus ``batches`` of (pkey, offsets, digests (n, 32)), without offsets below
        ``keep_from[pkey]`` (a partition missing from ``keep_from`` keeps everything)."""
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
            k: [(self.offsets[k], self.digests[k])] for k in self.offsets}
        for pkey, offsets, digests in batches:
            parts.setdefault(pkey, []).append((np.asarray(offsets, dtype=np.int64),
                                               np.asarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)))
        out_offsets, out_digests = {}, {}
        for pkey, chunks in parts.items():
            offsets = np.concatenate([c[0] for c in chunks])
            digests = np.concatenate([c[1] for c in chunks])
            offsets, first = np.unique(offsets, return_index=True)  # one record per offset: keep one copy
            digests = digests[first]
            keep = offsets >= keep_from.get(pkey, np.iinfo(np.int64).min)
            if keep.any():
                out_offsets[pkey], out_digests[pkey] = offsets[keep], digests[keep]
        return VerifiedSets(out_offsets, out_digests)

    def save(self, directory: Path) -> None:
        arrays: dict[str, np.ndarray] = {}
        for i, pkey in enumerate(sorted(self.offsets)):
            arrays[f"name_{i}"] = np.frombuffer(pkey.encode("utf-8"), dtype=np.uint8)
            arrays[f"offsets_{i}"] = self.offsets[pkey]
            arrays[f"digests_{i}"] = self.digests[pkey]
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write_bytes(directory / FILE_NAME, buffer.getvalue())

    @classmethod
    def load(cls, directory: Path) -> VerifiedSets:
        """What the last run saved; empty if there is no file or it cannot be read (it is only a cache)."""
        path = directory / FILE_NAME
        try:
            with np.load(path, allow_pickle=False) as data:
                offsets, digests = {}, {}
                i = 0
                while f"name_{i}" in data:
                    pkey = data[f"name_{i}"].tobytes().decode("utf-8")
                    o, d = data[f"offsets_{i}"].astype(np.int64), data[f"digests_{i}"].astype(np.uint8)
                    if d.shape != (len(o), DIGEST_BYTES) or (len(o) > 1 and not (np.diff(o) > 0).all()):
                        return cls()
                    offsets[pkey], digests[pkey] = o, d
                    i += 1
        except (OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, zipfile.BadZipFile):
            return cls()
        return cls(offsets, digests)
