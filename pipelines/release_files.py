"""The shuffler's release files: a release's signed batches, streamed to ``state/releases/<id>.bin``.

A release file is written (and fsynced) before the release is sealed in the ledger, so a run killed between
sealing and publishing republishes the identical bytes. The file is a sequence of frames, a 4-byte
big-endian length then one encoded ``ReleaseBatch``; its SHA-256 is the ledger entry's digest.

Why streaming: a release of a crowd of millions of devices must not exist in memory as a Python object per
message plus the whole signed blob and its copies; here the driver holds one release's messages as
``SealedMessage``\\ s and one encoded batch at a time, and publishing reads the file back frame by frame.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transforms.shuffle import ReleasePart
from transforms.state.files import ensure_dir
from transforms.state.ledger import ReleaseKey

FRAME = struct.Struct(">I")


@dataclass(frozen=True)
class ReleaseFile:
    """A release written to a temporary file, not yet in place (``commit``) or thrown away (``discard``)."""

    key: ReleaseKey
    release_id: str
    path: Path
    temp: Path
    digest: str
    n_sets: int
    n_messages: int
    batches: int

    def commit(self) -> None:
        """Rename into place and make the name durable (the content was fsynced when written)."""
        os.replace(self.temp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.temp.unlink()


def part_name(part: ReleasePart) -> str:
    """Staging name of a part: its release id, then its sub-key, so a release's parts load together."""
    from transforms.trust.release import release_id_of

    return f"{release_id_of(part.spec_id, part.crowd_id, part.window_end_ms)}-{part.subkey:05d}"


def write_release(directory: Path, parts: Sequence[ReleasePart], key_id: str, signer: Any) -> ReleaseFile:
    """Number, sign and encode one release's batches into a fsynced temporary file beside its final path.

    ``parts`` are the staged parts of one (spec, crowd, window), in sub-key order; at least one set.
    """
    from schemas import encode_record  # noqa: F401  (schemas must import before trust's encoders)
    from transforms.trust.message_set import SealedMessage
    from transforms.trust.release import (
        ReleaseBatch,
        encode_release_batch,
        release_id_of,
        sign_release_batch,
        split_into_batches,
    )

    first = parts[0]
    spec_id, crowd, end = first.spec_id, first.crowd_id, first.window_end_ms
    if any((p.spec_id, p.crowd_id, p.window_end_ms) != (spec_id, crowd, end) for p in parts):
        raise ValueError("write_release takes the parts of one release")
    n_sets = sum(p.n_sets for p in parts)
    deleted = None if any(p.deleted is None for p in parts) else sum(p.deleted for p in parts)
    messages = [SealedMessage(c, s) for p in parts for c, s in p.messages]
    rid = release_id_of(spec_id, crowd, end)
    chunks = split_into_batches(messages)
    path = Path(directory) / f"{rid}.bin"
    ensure_dir(path.parent)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    digest = hashlib.sha256()
    try:
        with open(temp, "wb") as handle:
            for i, chunk in enumerate(chunks):
                batch = ReleaseBatch(rid, spec_id, crowd, end, i, len(chunks), n_sets, len(messages), deleted,
                                     chunk)
                data = encode_release_batch(sign_release_batch(batch, key_id, signer))
                for piece in (FRAME.pack(len(data)), data):
                    handle.write(piece)
                    digest.update(piece)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    return ReleaseFile(ReleaseKey(spec_id, crowd, end), rid, path, temp, digest.hexdigest(), n_sets, len(messages),
                       len(chunks))


def file_digest(path: Path) -> str:
    """SHA-256 of a release file, read in chunks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def iter_batches(path: Path) -> Iterator[bytes]:
    """The encoded batches of a release file, one at a time; a truncated frame is an error."""
    with open(path, "rb") as handle:
        while header := handle.read(FRAME.size):
            if len(header) < FRAME.size:
                raise ValueError(f"release file {path} ends inside a frame header")
            (size,) = FRAME.unpack(header)
            data = handle.read(size)
            if len(data) < size:
                raise ValueError(f"release file {path} ends inside a batch ({len(data)} of {size} bytes)")
            yield data
