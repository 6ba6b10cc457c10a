"""Authenticated message sets of one (spec, crowd, window) packed into numpy arrays, for the shuffler's dedupe.

Why: the local runner buffers every element of a group-by-key, and one Python object per set (a pickled
``SetElement``: ~225 bytes, plus the runner's copies of it) made the shuffler's memory grow by ~1.7 kB per
pending report. ``PackedSets`` holds n sets as fixed-width arrays -- raw device id (16 bytes), event time,
the first 16 bytes of the record's SHA-256, Kafka position (a source index and an offset), message count --
plus one ``PackedMessages`` of their sealed payloads: payload + 32 bytes per single-message set, and no
per-set object anywhere. It pickles to a versioned, validated layout and still iterates as ``SetElement``s
(for inspection and tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from transforms.shuffler.elements import SetElement
from transforms.shuffler.packed import PackedMessages
from transforms.wire.elements import SourceRef

VERSION = 1
ID_BYTES = 16  # a device id is 32 lowercase hex digits (checked by the message-set decoder)
DIGEST_BYTES = 16  # SHA-256 prefix: tells byte-identical copies of one device's sets apart (2^-64 per pair)


class PackedSets:
    """Sets of one (spec, crowd, window): columns per set and one ``PackedMessages`` (see the module doc)."""
    __slots__ = ("crowd_id", "devices", "digests", "event_ms", "messages", "n_messages", "offsets", "source_index",
                 "sources", "spec_id", "window_end_ms")

    def __init__(self, spec_id: str, crowd_id: str | None, window_end_ms: int, *, devices: np.ndarray,
                 event_ms: np.ndarray, digests: np.ndarray, sources: Sequence[tuple[str, int]],
                 source_index: np.ndarray, offsets: np.ndarray, n_messages: np.ndarray, messages: PackedMessages):
        n = len(event_ms)
        self.devices = np.asarray(devices, dtype=np.uint8).reshape(n, ID_BYTES)
        self.digests = np.asarray(digests, dtype=np.uint8).reshape(n, DIGEST_BYTES)
        self.event_ms, self.offsets = np.asarray(event_ms, np.int64), np.asarray(offsets, np.int64)
        self.source_index, self.n_messages = np.asarray(source_index, np.int32), np.asarray(n_messages, np.int32)
        self.sources = tuple((str(t), int(p)) for t, p in sources)
        if any(a.shape != (n,) for a in (self.event_ms, self.offsets, self.source_index, self.n_messages)):
            raise ValueError("every per-set column must have one entry per set")
        if n and (self.source_index.min() < 0 or self.source_index.max() >= len(self.sources)):
            raise ValueError("a source index points outside the sources")
        if int(self.n_messages.sum()) != len(messages) or (n and self.n_messages.min() < 0):
            raise ValueError("message counts do not add up to the messages")
        self.spec_id, self.crowd_id, self.window_end_ms = spec_id, crowd_id, int(window_end_ms)
        self.messages = messages

    @classmethod
    def of(cls, spec_id: str, crowd_id: str | None, window_end_ms: int, items: Sequence[Any]) -> PackedSets:
        """Pack ``SetElement``s (all of this spec, crowd and window).

        Columns come from one transpose (``zip(*items)``) and one ``bytes.fromhex`` of every device id: ingress
        packs every set it admits, and a pass over the items per column cost ~1.6 microseconds a set."""
        n = len(items)
        if not n:
            return cls(spec_id, crowd_id, window_end_ms, devices=np.zeros(0, np.uint8), event_ms=np.zeros(0, np.int64),
                       digests=np.zeros(0, np.uint8), sources=[], source_index=np.zeros(0, np.int32),
                       offsets=np.zeros(0, np.int64), n_messages=np.zeros(0, np.int32),
                       messages=PackedMessages.of(()))
        _, _, devices, event_ms, _, digests, messages, refs = zip(*items, strict=True)
        topics, partitions, offsets = zip(*refs, strict=True)
        sources = dict.fromkeys(zip(topics, partitions, strict=True))
        if len(sources) == 1:
            index = np.zeros(n, np.int32)
        else:
            position = {source: k for k, source in enumerate(sources)}
            index = np.array([position[s] for s in zip(topics, partitions, strict=True)], np.int32)
        if not all(len(d) == 2 * ID_BYTES for d in devices):  # one fromhex of all would misalign them
            raise ValueError(f"a device id is not {2 * ID_BYTES} hex digits")
        digest_bytes = b"".join([d[:DIGEST_BYTES] for d in digests])
        if len(digest_bytes) != n * DIGEST_BYTES:
            raise ValueError(f"a digest is shorter than {DIGEST_BYTES} bytes")
        # Consistent by construction (one row per item, indices from the sources' own numbering, counts from
        # the very messages packed): built without __init__'s checks, which cost ~7 microseconds a pack, and
        # ingress packs every (window, bucket) of every batch: ~4 sets a pack at 512 buckets.
        self = object.__new__(cls)
        self.spec_id, self.crowd_id, self.window_end_ms = spec_id, crowd_id, int(window_end_ms)
        self.devices = np.frombuffer(bytes.fromhex("".join(devices)), np.uint8).reshape(n, ID_BYTES)
        self.digests = np.frombuffer(digest_bytes, np.uint8).reshape(n, DIGEST_BYTES)
        self.event_ms, self.offsets = np.array(event_ms, np.int64), np.array(offsets, np.int64)
        self.source_index, self.n_messages = index, np.fromiter(map(len, messages), np.int32, n)
        self.sources = tuple((str(t), int(p)) for t, p in sources)
        self.messages = PackedMessages.of([m for ms in messages for m in ms])
        return self

    @classmethod
    def concat(cls, packs: Sequence[PackedSets]) -> PackedSets:
        """One pack of several of the same (spec, crowd, window), in the given order."""
        if not packs:
            raise ValueError("nothing to concatenate")
        if len(packs) == 1:
            return packs[0]
        first = packs[0]
        if any((p.spec_id, p.crowd_id, p.window_end_ms) != (first.spec_id, first.crowd_id, first.window_end_ms)
               for p in packs):
            raise ValueError("packs of different (spec, crowd, window) cannot be joined")
        sources: dict[tuple[str, int], int] = {}
        remapped = []
        for p in packs:
            table = np.asarray([sources.setdefault(s, len(sources)) for s in p.sources], dtype=np.int32)
            remapped.append(table[p.source_index] if len(p) else np.zeros(0, np.int32))
        return cls(first.spec_id, first.crowd_id, first.window_end_ms,
                   devices=np.concatenate([p.devices for p in packs]),
                   event_ms=np.concatenate([p.event_ms for p in packs]),
                   digests=np.concatenate([p.digests for p in packs]), sources=list(sources),
                   source_index=np.concatenate(remapped), offsets=np.concatenate([p.offsets for p in packs]),
                   n_messages=np.concatenate([p.n_messages for p in packs]),
                   messages=PackedMessages.concat([p.messages for p in packs]))

    def __len__(self) -> int:
        return len(self.event_ms)

    @property
    def nbytes(self) -> int:
        """Bytes of array data held (what a buffer of packs is bounded by)."""
        return (self.devices.nbytes + self.digests.nbytes + 8 * 2 * len(self) + 4 * 2 * len(self)
                + len(self.messages.payload) + 12 * len(self.messages))

    def source(self, row: int) -> SourceRef:
        topic, partition = self.sources[int(self.source_index[row])]
        return SourceRef(topic, partition, int(self.offsets[row]))

    def arrival_order(self) -> np.ndarray:
        """Rows by device, then event time, then Kafka position (topic, partition, offset): the order in
        which dedupe keeps a device's sets, independent of how the sets were batched or grouped."""
        position = np.empty(len(self.sources), dtype=np.int64)
        position[sorted(range(len(self.sources)), key=lambda i: self.sources[i])] = np.arange(len(self.sources))
        device = np.ascontiguousarray(self.devices).view(">u8")  # two big-endian words: byte order
        source_rank = position[self.source_index] if len(self) else np.zeros(0, np.int64)
        return np.lexsort([self.offsets, source_rank, self.event_ms, device[:, 1], device[:, 0]])

    def message_rows(self, rows: np.ndarray) -> np.ndarray:
        """Indices of the messages of sets ``rows`` (in that order, each set's messages in order)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(self.n_messages, dtype=np.int64)[:-1]])
        counts = self.n_messages[rows].astype(np.int64)
        total = int(counts.sum())
        if not total:
            return np.zeros(0, dtype=np.int64)
        first_out = np.repeat(np.cumsum(counts) - counts, counts)
        return np.repeat(starts[rows], counts) + (np.arange(total) - first_out)

    def __iter__(self) -> Iterator[Any]:
        """Each set as a ``SetElement`` (digest: its 16-byte prefix): the unpacked view, for inspection."""
        messages = iter(self.messages)
        for row in range(len(self)):
            yield SetElement(self.spec_id, self.crowd_id, self.devices[row].tobytes().hex(),
                             int(self.event_ms[row]), self.window_end_ms, self.digests[row].tobytes(),
                             tuple(next(messages) for _ in range(int(self.n_messages[row]))), self.source(row))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedSets):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedSets({self.spec_id}, {self.crowd_id}, {self.window_end_ms}: {len(self)} sets)"

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore_sets, (VERSION, self.spec_id, self.crowd_id, self.window_end_ms, self.devices.tobytes(),
                               self.event_ms.tobytes(), self.digests.tobytes(), self.sources,
                               self.source_index.tobytes(), self.offsets.tobytes(), self.n_messages.tobytes(),
                               self.messages)


def _restore_sets(version: int, spec_id: str, crowd_id: str | None, window_end_ms: int, devices: bytes,
                  event_ms: bytes, digests: bytes, sources: Sequence[tuple[str, int]], source_index: bytes,
                  offsets: bytes, n_messages: bytes, messages: PackedMessages) -> PackedSets:
    if version != VERSION:
        raise ValueError(f"packed sets of version {version}; this esa reads version {VERSION}")
    return PackedSets(spec_id, crowd_id, window_end_ms, devices=np.frombuffer(devices, np.uint8),
                      event_ms=np.frombuffer(event_ms, np.int64), digests=np.frombuffer(digests, np.uint8),
                      sources=sources, source_index=np.frombuffer(source_index, np.int32),
                      offsets=np.frombuffer(offsets, np.int64), n_messages=np.frombuffer(n_messages, np.int32),
                      messages=messages)
