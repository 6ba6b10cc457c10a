"""The edge's local spool: reports acknowledged to devices while Kafka could not take them, kept until it can.

A 202 means the report is in Kafka or on this disk, so the spool is append-only and fsynced before an append
returns (one fsync per batch of concurrent appends: group commit). Records are framed ``u32 length | u32 CRC32C
| bytes`` in segment files named by their first record's sequence number; a cursor file (written atomically)
says how far the drain has reached. After a crash (SIGKILL included) the torn tail of the last segment -- an
append that never returned, so never acknowledged -- is cut off, and draining resumes at the cursor: a record
produced but not yet past the cursor is produced again, a byte-identical copy the shuffler's dedupe counts as a
duplicate. Holds only report bodies: no address, no time, nothing about the request.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import crc32c

from transforms.state.files import atomic_write_bytes

__all__ = ["Spool", "SpoolFullError"]

_FRAME = struct.Struct(">II")
_CURSOR = struct.Struct(">QQ")  # segment's first sequence number, byte offset in it
SEGMENT_BYTES = 64 * 1024 * 1024
_SUFFIX = ".seg"


class SpoolFullError(RuntimeError):
    """An append refused: the spool is at its size limit or the disk is low; nothing was written."""


class Spool:
    """Segments under ``directory``; thread-safe (appends, drain reads and cursor commits take one lock)."""

    def __init__(self, directory: Path, max_bytes: int, min_free_bytes: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.max_bytes, self.min_free_bytes = max_bytes, min_free_bytes
        self._lock = threading.Lock()
        self._segments: list[int] = sorted(int(p.name[:-len(_SUFFIX)]) for p in self.directory.iterdir()
                                           if p.name.endswith(_SUFFIX) and p.name[:-len(_SUFFIX)].isdigit())
        self._cursor = self._read_cursor()
        self._sizes: dict[int, int] = {}
        self._records = 0
        self._bytes = 0
        self._next_seq = 0
        self._recover()
        self._append = None if not self._segments else open(self._path(self._segments[-1]), "ab")  # noqa: SIM115

    # -- state -------------------------------------------------------------------------------------------

    def _path(self, first_seq: int) -> Path:
        return self.directory / f"{first_seq:020d}{_SUFFIX}"

    def _read_cursor(self) -> tuple[int, int]:
        path = self.directory / "cursor"
        if path.exists() and path.stat().st_size == _CURSOR.size:
            seg, offset = _CURSOR.unpack(path.read_bytes())
            return int(seg), int(offset)
        return (self._segments[0], 0) if self._segments else (0, 0)

    def _recover(self) -> None:
        """Cut each segment's torn tail; count the records not yet drained (from the cursor on)."""
        seg0, off0 = self._cursor
        for seg in list(self._segments):
            if seg < seg0:  # drained before the crash, not deleted yet
                self._path(seg).unlink(missing_ok=True)
                self._segments.remove(seg)
                continue
            path = self._path(seg)
            good, count, pending_bytes = 0, 0, 0
            with open(path, "rb") as f:
                data = f.read()
            while good + _FRAME.size <= len(data):
                length, crc = _FRAME.unpack_from(data, good)
                end = good + _FRAME.size + length
                if end > len(data) or crc32c.crc32c(data[good + _FRAME.size:end]) != crc:
                    break
                if seg != seg0 or good >= off0:
                    count += 1
                    pending_bytes += length
                good = end
            if good < len(data):
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
            self._sizes[seg] = good
            self._records += count
            self._bytes += pending_bytes
            self._next_seq = seg + count + (0 if seg != seg0 else self._count_before(data, off0))
        if self._segments and self._cursor[0] not in self._segments:
            self._cursor = (self._segments[0], 0)

    @staticmethod
    def _count_before(data: bytes, offset: int) -> int:
        n, at = 0, 0
        while at < offset:
            length, _ = _FRAME.unpack_from(data, at)
            at += _FRAME.size + length
            n += 1
        return n

    def depth(self) -> tuple[int, int]:
        """(records, bytes) appended and not yet drained."""
        return self._records, self._bytes

    def disk_bytes(self) -> int:
        return sum(self._sizes.values())

    # -- appending ---------------------------------------------------------------------------------------

    def append_many(self, bodies: Sequence[bytes]) -> None:
        """Append ``bodies`` in order and fsync; ``SpoolFullError`` (nothing written) over the size limit or with
        less than ``min_free_bytes`` left on the file system."""
        size = sum(_FRAME.size + len(b) for b in bodies)
        with self._lock:
            if self.disk_bytes() + size > self.max_bytes:
                raise SpoolFullError(f"spool at its limit of {self.max_bytes} bytes")
            stat = os.statvfs(self.directory)
            if stat.f_bavail * stat.f_frsize - size < self.min_free_bytes:
                raise SpoolFullError(f"less than {self.min_free_bytes} bytes free on the spool's file system")
            if self._append is None or self._sizes[self._segments[-1]] >= SEGMENT_BYTES:
                self._roll()
            assert self._append is not None
            frames = b"".join(_FRAME.pack(len(b), crc32c.crc32c(b)) + bytes(b) for b in bodies)
            try:
                self._append.write(frames)
                self._append.flush()
                os.fsync(self._append.fileno())
            except OSError:
                self._append.truncate(self._sizes[self._segments[-1]])  # what a retry would repeat
                raise
            self._sizes[self._segments[-1]] += len(frames)
            self._records += len(bodies)
            self._bytes += sum(len(b) for b in bodies)
            self._next_seq += len(bodies)

    def _roll(self) -> None:
        if self._append is not None:
            self._append.close()
        seg = self._next_seq
        self._segments.append(seg)
        self._sizes[seg] = 0
        self._append = open(self._path(seg), "ab")  # noqa: SIM115
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)  # the new segment's name is durable before a record in it is acknowledged
        finally:
            os.close(fd)
        if len(self._segments) == 1:
            self._cursor = (seg, 0)

    # -- draining ----------------------------------------------------------------------------------------

    def peek(self, max_records: int) -> tuple[list[bytes], tuple[int, int]]:
        """Up to ``max_records`` bodies from the cursor on, in append order, and the cursor just past them."""
        with self._lock:
            seg, offset = self._cursor
            if seg not in self._sizes or offset >= self._sizes[seg]:
                return [], self._cursor
            with open(self._path(seg), "rb") as f:
                f.seek(offset)
                data = f.read(min(self._sizes[seg] - offset, 8 * 1024 * 1024))
        out, at = [], 0
        while len(out) < max_records and at + _FRAME.size <= len(data):
            length, _ = _FRAME.unpack_from(data, at)
            if at + _FRAME.size + length > len(data):
                break
            out.append(data[at + _FRAME.size:at + _FRAME.size + length])
            at += _FRAME.size + length
        return out, (seg, offset + at)

    def commit(self, cursor: tuple[int, int], records: int, nbytes: int) -> None:
        """Mark everything before ``cursor`` drained (durably), deleting segments left wholly behind."""
        with self._lock:
            seg, offset = cursor
            if offset >= self._sizes.get(seg, 0) and seg != self._segments[-1]:
                later = [s for s in self._segments if s > seg]
                seg, offset = later[0], 0
            self._cursor = (seg, offset)
            atomic_write_bytes(self.directory / "cursor", _CURSOR.pack(seg, offset), 0o600)
            for old in [s for s in self._segments if s < seg]:
                self._path(old).unlink(missing_ok=True)
                self._segments.remove(old)
                self._sizes.pop(old, None)
            self._records -= records
            self._bytes -= nbytes
            if self._records == 0 and self._segments and offset == self._sizes[self._segments[-1]]:
                self._reset()

    def _reset(self) -> None:
        """Drained to the end: start the next append on a fresh segment so the drained one can go."""
        if self._append is not None:
            self._append.close()
            self._append = None
        (self.directory / "cursor").unlink(missing_ok=True)  # first: a crash in between re-drains, never skips
        for seg in self._segments:
            self._path(seg).unlink(missing_ok=True)
        self._segments.clear()
        self._sizes.clear()
        self._cursor = (self._next_seq, 0)

    def close(self) -> None:
        with self._lock:
            if self._append is not None:
                self._append.close()
                self._append = None
