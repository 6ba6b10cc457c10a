"""Sealed messages packed into numpy arrays and one bytes buffer, for the shuffler's hot path.

Why: a message as a Python ``(channel, bytes)`` tuple costs ~180 bytes of object headers on top of its
payload, and Beam's local runner keeps grouped values as Python objects, so a crowd of millions of devices
held as tuples needs gigabytes. ``PackedMessages`` holds n messages as an int32 channel array, an int64
offset array and one payload buffer (payload + 12 bytes per message); gathering a permutation is one numpy
fancy-index when the payloads have equal length (sealed payloads are padded to the mechanism's longest
encoding, so they do). It still reads as a sequence of ``(channel, payload)`` pairs.

``PackedUnits`` is a list of *units* (one device's kept sets in a window: how many sets, which messages)
over one ``PackedMessages``. Both pickle to a versioned, validated layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

VERSION = 1
Message = tuple[int, bytes]


class PackedMessages(Sequence[Message]):
    """An immutable sequence of (channel, sealed payload) with array storage (see the module doc)."""

    __slots__ = ("channels", "offsets", "payload")

    def __init__(self, channels: np.ndarray, offsets: np.ndarray, payload: bytes):
        channels = np.asarray(channels, dtype=np.int32)
        offsets = np.asarray(offsets, dtype=np.int64)
        if channels.ndim != 1 or offsets.shape != (len(channels) + 1,):
            raise ValueError(f"need n channels and n + 1 offsets, got {channels.shape} and {offsets.shape}")
        if offsets[0] != 0 or offsets[-1] != len(payload) or (len(channels) and np.any(np.diff(offsets) < 0)):
            raise ValueError("offsets must rise from 0 to the payload length")
        self.channels, self.offsets, self.payload = channels, offsets, bytes(payload)

    @classmethod
    def of(cls, messages: Iterable[Message]) -> PackedMessages:
        """Pack (channel, payload) pairs (a ``PackedMessages`` is returned as it is)."""
        if isinstance(messages, PackedMessages):
            return messages
        messages = list(messages)
        sizes = np.fromiter((len(s) for _, s in messages), dtype=np.int64, count=len(messages))
        offsets = np.zeros(len(messages) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        channels = np.fromiter((c for c, _ in messages), dtype=np.int32, count=len(messages))
        return cls(channels, offsets, b"".join(s for _, s in messages))

    @classmethod
    def concat(cls, packs: Sequence[PackedMessages]) -> PackedMessages:
        if not packs:
            return cls.of(())
        if len(packs) == 1:
            return packs[0]
        starts = np.cumsum([0] + [len(p.payload) for p in packs[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(packs, starts,
                                                                                               strict=True)])
        return cls(np.concatenate([p.channels for p in packs]), offsets, b"".join(p.payload for p in packs))

    def __len__(self) -> int:
        return len(self.channels)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> PackedMessages: ...

    def __getitem__(self, index: int | slice) -> Message | PackedMessages:
        if isinstance(index, slice):
            return self.take(np.arange(*index.indices(len(self))))
        i = range(len(self))[index]  # IndexError and negative indices as for a tuple
        return int(self.channels[i]), self.payload[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self) -> Iterator[Message]:
        payload, offsets = self.payload, self.offsets.tolist()
        for i, channel in enumerate(self.channels.tolist()):
            yield channel, payload[offsets[i]:offsets[i + 1]]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedMessages):
            return (self.payload == other.payload and np.array_equal(self.channels, other.channels)
                    and np.array_equal(self.offsets, other.offsets))
        if isinstance(other, tuple | list):
            return len(other) == len(self) and all(a == tuple(b) for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays: unhashable, like a list

    def __repr__(self) -> str:
        return f"PackedMessages({len(self)} messages, {len(self.payload)} payload bytes)"

    def width(self) -> int | None:
        """The common payload length, or None if lengths differ (or there is no message)."""
        if not len(self):
            return None
        sizes = np.diff(self.offsets)
        return int(sizes[0]) if np.all(sizes == sizes[0]) else None

    def take(self, indices: np.ndarray) -> PackedMessages:
        """The messages at ``indices``, in that order (vectorized when the payloads have equal length)."""
        indices = np.asarray(indices, dtype=np.int64)
        channels = self.channels[indices]
        width = self.width()
        if width is not None:
            rows = np.frombuffer(self.payload, dtype=np.uint8).reshape(len(self), width)
            return PackedMessages(channels, np.arange(len(indices) + 1, dtype=np.int64) * width,
                                  rows[indices].tobytes())
        sizes = np.diff(self.offsets)[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        starts, payload = self.offsets[:-1][indices].tolist(), self.payload
        return PackedMessages(channels, offsets, b"".join(payload[s:s + n] for s, n in zip(starts, sizes.tolist(),
                                                                                             strict=True)))

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore_messages, (VERSION, self.channels.tobytes(), self.offsets.tobytes(), self.payload)


def _restore_messages(version: int, channels: bytes, offsets: bytes, payload: bytes) -> PackedMessages:
    if version != VERSION:
        raise ValueError(f"packed messages of version {version}; this esa reads version {VERSION}")
    return PackedMessages(np.frombuffer(channels, dtype=np.int32).copy(),
                          np.frombuffer(offsets, dtype=np.int64).copy(), payload)


class PackedUnits:
    """Units (one device's kept sets: set count, its messages in order) over one ``PackedMessages``.

    ``ranks`` (uint64, one per unit: a keyed PRF of the device) give the canonical order of a sub-crowd's
    units, so a release does not depend on how devices were bucketed or in which order groups arrived.
    """

    __slots__ = ("messages", "n_messages", "n_sets", "ranks")

    def __init__(self, n_sets: np.ndarray, n_messages: np.ndarray, messages: PackedMessages,
                 ranks: np.ndarray | None = None):
        n_sets, n_messages = np.asarray(n_sets, dtype=np.int32), np.asarray(n_messages, dtype=np.int32)
        ranks = np.arange(len(n_sets), dtype=np.uint64) if ranks is None else np.asarray(ranks, dtype=np.uint64)
        if n_sets.shape != n_messages.shape or n_sets.ndim != 1 or ranks.shape != n_sets.shape:
            raise ValueError("n_sets, n_messages and ranks must be three vectors of the same length")
        if int(n_messages.sum()) != len(messages) or (len(n_sets) and (n_sets.min() < 1 or n_messages.min() < 0)):
            raise ValueError("unit sizes do not add up to the messages, or a unit has no set")
        self.n_sets, self.n_messages, self.messages, self.ranks = n_sets, n_messages, messages, ranks

    @classmethod
    def of(cls, units: Sequence[tuple[int, Sequence[Message]]], ranks: Sequence[int] | None = None) -> PackedUnits:
        return cls(np.fromiter((n for n, _ in units), np.int32, len(units)),
                   np.fromiter((len(ms) for _, ms in units), np.int32, len(units)),
                   PackedMessages.of(m for _, ms in units for m in ms),
                   None if ranks is None else np.fromiter(ranks, np.uint64, len(units)))

    @classmethod
    def concat(cls, parts: Sequence[PackedUnits]) -> PackedUnits:
        """Several packs as one, units in rank order (stable: equal ranks keep the given order)."""
        if not parts:
            return cls(np.zeros(0, np.int32), np.zeros(0, np.int32), PackedMessages.of(()))
        joined = parts[0] if len(parts) == 1 else cls(
            np.concatenate([p.n_sets for p in parts]), np.concatenate([p.n_messages for p in parts]),
            PackedMessages.concat([p.messages for p in parts]), np.concatenate([p.ranks for p in parts]))
        order = np.argsort(joined.ranks, kind="stable")
        if np.array_equal(order, np.arange(len(order))):
            return joined
        return cls(joined.n_sets[order], joined.n_messages[order], joined.messages.take(joined.messages_of(order)),
                   joined.ranks[order])

    def __len__(self) -> int:
        return len(self.n_sets)

    def __iter__(self) -> Iterator[tuple[int, tuple[Message, ...]]]:
        """Each unit as (set count, its messages): the unpacked view, for inspection and tests."""
        messages = iter(self.messages)
        for n, k in zip(self.n_sets.tolist(), self.n_messages.tolist(), strict=True):
            yield n, tuple(next(messages) for _ in range(k))

    def messages_of(self, units: np.ndarray) -> np.ndarray:
        """Indices of the messages of ``units`` (in unit order, each unit's messages in order)."""
        units = np.asarray(units, dtype=np.int64)
        starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(self.n_messages, dtype=np.int64)[:-1]])
        counts = self.n_messages[units].astype(np.int64)
        if not counts.sum():
            return np.zeros(0, dtype=np.int64)
        # arange within each unit: global position minus the unit's first output position, plus its start
        first_out = np.repeat(np.cumsum(counts) - counts, counts)
        return np.repeat(starts[units], counts) + (np.arange(counts.sum()) - first_out)

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore_units, (VERSION, self.n_sets.tobytes(), self.n_messages.tobytes(), self.messages,
                                self.ranks.tobytes())


def _restore_units(version: int, n_sets: bytes, n_messages: bytes, messages: PackedMessages,
                   ranks: bytes) -> PackedUnits:
    if version != VERSION:
        raise ValueError(f"packed units of version {version}; this esa reads version {VERSION}")
    return PackedUnits(np.frombuffer(n_sets, np.int32).copy(), np.frombuffer(n_messages, np.int32).copy(), messages,
                       np.frombuffer(ranks, np.uint64).copy())
