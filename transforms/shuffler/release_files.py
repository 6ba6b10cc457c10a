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
import itertools
import os
import secrets
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from transforms.shuffler.blanket import (
    Dummies,
    ReleaseBlanket,
    insert_layout,
    interleave,
    key_id_counts,
    merge_counts,
)
from transforms.shuffler.graph import PartHeader, ReleasePart, part_header
from transforms.shuffler.packed import PackedMessages
from transforms.state.files import ensure_dir
from transforms.state.ledger import ReleaseKey

FRAME = struct.Struct(">I")
MAX_BATCH_BYTES = 512 * 1024  # the default of transforms.trust.release.split_into_batches


@dataclass(frozen=True)
class ReleaseFile:
    """A release written to a temporary file, not yet in place (``commit``) or thrown away (``discard``)."""

    key: ReleaseKey
    release_id: str
    path: Path
    temp: Path
    digest: str
    n_sets: int  # the real sets and messages (what the shuffler consumed), dummies not included
    n_messages: int
    batches: int
    dummies: int = 0  # dummy reports added by the blanket; the signed batches count them in their totals

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


def write_release(directory: Path, parts: Sequence[ReleasePart], key_id: str, signer: Any,
                  headers: Sequence[PartHeader] | None = None, blanket: ReleaseBlanket | None = None
                  ) -> ReleaseFile:
    """Number, sign and encode one release's batches into a fsynced temporary file beside its final path.

    ``parts`` are the staged parts of one (spec, crowd, window), in sub-key order; at least one set. They may
    be read from staging at each access (``pipelines.shuffle.StagedParts``): this function holds one at a time.

    Every batch is signed with the release's totals (messages, batches), and where batches are cut depends on
    every message's encoded size, so the layout must be known before the first batch is written -- and a
    release can be larger than memory. Given the parts' staged ``headers``, and when all of the release's
    messages encode to one size (sealed payloads are padded to the mechanism's longest encoding, so they do
    unless the channels span two varint lengths), the layout follows from the headers: one pass, each part
    read once and checked against its header. Otherwise two passes: the layout first (12 bytes per message),
    then the batches. That first pass goes backwards, so the part it ends on (the first) is the one the
    second pass starts with: a part is read twice at most, and a release of one part once.

    With a ``blanket`` (``transforms.shuffler.blanket``), the first pass also counts the real messages' key
    ids, and its m dummies are inserted at their slots: the batches' signed totals count them, the returned
    ``ReleaseFile`` counts real sets and messages and its ``dummies`` apart.
    """
    from schemas import encode_record  # noqa: F401  (schemas must import before trust's encoders)
    from transforms.trust.release import ReleaseBatch, release_id_of
    from transforms.trust.release_packed import signed_batch_bytes

    if not len(parts) or (headers is not None and len(headers) != len(parts)):
        raise ValueError("write_release needs at least one part (and one header per part, if headers are given)")
    dummies = None
    layout = _layout_of_headers(headers) if headers is not None and not (blanket and blanket.m) else None
    first = None
    if layout is None:
        layout, first, dummies = _layout_of_parts(parts, blanket)
    spec_id, crowd, end, n_sets, n_messages, deleted, bounds = layout
    m = len(dummies.positions) if dummies is not None else 0
    rid = release_id_of(spec_id, crowd, end)
    path = Path(directory) / f"{rid}.bin"
    ensure_dir(path.parent)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    digest = hashlib.sha256()
    try:
        with open(temp, "wb") as handle:
            # one part at a time (the first maybe already in hand), cut into the batches' message arrays
            chunks = _chunks(_packs(parts, first, headers), bounds, dummies, rid)
            del first
            for i, chunk in enumerate(chunks):
                batch = ReleaseBatch(rid, spec_id, crowd, end, i, len(bounds), n_sets + m, n_messages + m, deleted, ())
                data = signed_batch_bytes(batch, chunk.channels, chunk.offsets, chunk.payload, key_id, signer)
                for piece in (FRAME.pack(len(data)), data):
                    handle.write(piece)
                    digest.update(piece)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    return ReleaseFile(ReleaseKey(spec_id, crowd, end), rid, path, temp, digest.hexdigest(), n_sets, n_messages,
                       len(bounds), m)


class _Layout(NamedTuple):
    spec_id: str
    crowd_id: str | None
    window_end_ms: int
    n_sets: int
    n_messages: int
    deleted: int | None
    bounds: list[tuple[int, int]]


def _one_release(items: Sequence[PartHeader | ReleasePart]) -> tuple[str, str | None, int]:
    keys = {(p.spec_id, p.crowd_id, p.window_end_ms) for p in items}
    if len(keys) != 1:
        raise ValueError("write_release takes the parts of one release")
    return keys.pop()


def _deleted(items: Sequence[PartHeader | ReleasePart]) -> int | None:
    return None if any(p.deleted is None for p in items) else sum(p.deleted for p in items)  # type: ignore[misc]


def _layout_of_headers(headers: Sequence[PartHeader]) -> _Layout | None:
    """The layout from the staged headers alone, when every message encodes to one size; None otherwise."""
    spec_id, crowd, end = _one_release(headers)
    sizes = {message_bytes(h) for h in headers if h.n_messages}
    if None in sizes or len(sizes) > 1:
        return None
    n_messages = sum(h.n_messages for h in headers)
    bounds = uniform_batch_bounds(n_messages, sizes.pop()) if sizes else [(0, 0)]
    return _Layout(spec_id, crowd, end, sum(h.n_sets for h in headers), n_messages, _deleted(headers), bounds)


def _layout_of_parts(parts: Sequence[ReleasePart], blanket: ReleaseBlanket | None = None
                     ) -> tuple[_Layout, ReleasePart, Dummies | None]:
    """The layout read from the parts, last to first (see ``write_release``); the first part, still held; and
    the release's dummies, with the layout counting them where they go (the totals stay the real ones)."""
    part: ReleasePart | None = None
    kept, channels, lengths, key_ids = [], [], [], {}
    use = blanket if blanket is not None and blanket.m > 0 else None
    for i in reversed(range(len(parts))):
        part = parts[i]
        kept.append(part._replace(messages=()))  # its key and counts, not its messages
        pack = PackedMessages.of(part.messages)
        channels.append(pack.channels)
        lengths.append(np.diff(pack.offsets))
        if use is not None:
            merge_counts(key_ids, key_id_counts(pack, use.plaintext_bytes))
        del pack
        if i:
            part = None  # let it go before the next is read: one part at a time
    assert part is not None
    spec_id, crowd, end = _one_release(kept)
    all_channels, all_lengths = np.concatenate(channels[::-1]), np.concatenate(lengths[::-1])
    n_messages, dummies = len(all_channels), None
    if use is not None and sum(p.n_sets for p in kept):
        if spec_id != use.spec.spec_id:
            raise ValueError(f"the blanket of {use.spec.spec_id} given for a release of {spec_id}")
        dummies = use.dummies(crowd, end, n_messages, key_ids)
        all_channels, all_lengths = insert_layout(all_channels, all_lengths, dummies)
    bounds = batch_bounds_of(all_channels, all_lengths)
    return (_Layout(spec_id, crowd, end, sum(p.n_sets for p in kept), n_messages, _deleted(kept), bounds), part,
            dummies)


def _packs(parts: Sequence[ReleasePart], first: ReleasePart | None,
           headers: Sequence[PartHeader] | None) -> Iterator[PackedMessages]:
    """The messages of ``parts`` in order, a pack per part, ``parts[0]`` being ``first`` if given (not read again),
    each part checked against its header if given; each part is let go before the next is read."""
    held, first = first, None
    for i in range(len(parts)):
        part, held = (held if i == 0 and held is not None else parts[i]), None
        if headers is not None and part_header(part) != headers[i]:
            raise ValueError(f"staged part {i} of release {part.spec_id}/{part.crowd_id}/{part.window_end_ms} does "
                             "not match its staged header: the staging location is damaged")
        yield PackedMessages.of(part.messages)
        del part


def _chunks(packs: Iterator[PackedMessages], bounds: Sequence[tuple[int, int]], dummies: Dummies | None,
            rid: str) -> Iterator[PackedMessages]:
    """The messages of each batch (``bounds``) as one pack, cut from the parts' packs (the dummies, if any, at
    their slots); an error if the parts hold fewer or more messages than the bounds."""
    if dummies is not None:  # a blanket's release: message by message, through interleave
        stream = interleave((m for pack in packs for m in pack), dummies)
        for start, stop in bounds:
            chunk = PackedMessages.of(itertools.islice(stream, stop - start))
            if len(chunk) != stop - start:
                raise ValueError(f"release {rid} has fewer messages than its parts' headers say")
            yield chunk
        if next(stream, None) is not None:
            raise ValueError(f"release {rid} has more messages than its parts' headers say")
        return
    pending: list[PackedMessages] = []  # pieces of the batch being filled
    current, at = PackedMessages.of(()), 0  # the part being cut and the first of its messages not yet used
    for start, stop in bounds:
        need = stop - start
        while need:
            if at == len(current):
                current = None  # let the used part go before the next is read
                current, at = next(packs, None), 0
                if current is None:
                    raise ValueError(f"release {rid} has fewer messages than its parts' headers say")
                continue
            take = min(need, len(current) - at)
            pending.append(_slice(current, at, at + take))
            at, need = at + take, need - take
        yield PackedMessages.concat(pending) if pending else PackedMessages.of(())
        pending = []
    if at < len(current) or any(len(rest) for rest in packs):
        raise ValueError(f"release {rid} has more messages than its parts' headers say")


def _slice(pack: PackedMessages, start: int, stop: int) -> PackedMessages:
    """Messages ``start:stop`` of ``pack``, sharing no array with it (a batch may outlive the part it was cut
    from: the writer holds one part at a time)."""
    offsets = pack.offsets[start:stop + 1]
    return PackedMessages(pack.channels[start:stop].copy(), offsets - offsets[0],
                          pack.payload[int(offsets[0]):int(offsets[-1])])


def message_bytes(header: PartHeader) -> int | None:
    """The encoded size of every message of a part (channel and length varints, payload), from its header;
    None when its messages' sizes may differ."""
    if header.width is None or header.channels is None:
        return None
    low, high = header.channels
    varints = _varint_bytes(np.asarray([low, high, 0 if low <= 0 <= high else low], dtype=np.int64))
    if len(set(varints.tolist())) != 1:
        return None
    return int(varints[0]) + int(_varint_bytes(np.asarray([header.width]))[0]) + header.width


def uniform_batch_bounds(n_messages: int, size: int, max_bytes: int = MAX_BATCH_BYTES) -> list[tuple[int, int]]:
    """``batch_bounds_of`` for ``n_messages`` messages that all encode to ``size`` bytes, without arrays: the
    greedy cut puts as many as fit in every batch (at least one)."""
    budget = _budget(max_bytes)
    per = max(budget // size, 1)
    return [(start, min(start + per, n_messages)) for start in range(0, n_messages, per)] or [(0, 0)]


def _varint_bytes(values: np.ndarray) -> np.ndarray:
    """Length of Avro's zig-zag varint of each value (vectorized ``transforms.trust.release._varint_bytes``)."""
    v = values.astype(np.int64)
    zz = ((v << 1) ^ (v >> 63)).view(np.uint64)
    return 1 + sum((zz >= np.uint64(1 << (7 * k))).astype(np.int64) for k in range(1, 10))


def batch_bounds(messages: PackedMessages, max_bytes: int = MAX_BATCH_BYTES) -> list[tuple[int, int]]:
    """[start, stop) of each batch: the cut of ``split_into_batches`` (greedy, each batch's encoding within
    ``max_bytes``, a message over budget alone, an empty release one empty batch), from the arrays alone."""
    return batch_bounds_of(messages.channels, np.diff(messages.offsets), max_bytes)


def batch_bounds_of(channels: np.ndarray, lengths: np.ndarray, max_bytes: int = MAX_BATCH_BYTES
                    ) -> list[tuple[int, int]]:
    """``batch_bounds`` of the messages with these channels and payload lengths."""
    budget = _budget(max_bytes)
    sizes = (_varint_bytes(channels) + _varint_bytes(lengths) + lengths).tolist()
    bounds, start, used = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > budget:
            bounds.append((start, i))
            start, used = i, 0
        used += size
    if start < len(sizes) or not bounds:
        bounds.append((start, len(sizes)))
    return bounds


def _budget(max_bytes: int) -> int:
    from transforms.trust.release import BATCH_HEADER_BYTES

    if max_bytes - BATCH_HEADER_BYTES < 1024:
        raise ValueError(f"max_bytes must be at least {BATCH_HEADER_BYTES + 1024}, got {max_bytes}")
    return max_bytes - BATCH_HEADER_BYTES


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
