"""The shuffler's first step per (crowd, window, device bucket): hold open windows, dedupe, strip identity.

Open windows: every set is held (the next run re-reads it from its offset). Closed windows: one set per
device and window (``max_reports_per_window`` of them) -- the earliest by event time, then Kafka position, so
a rerun keeps the same ones. A copy of a kept set (the same signed bytes: an encoder's resend after a crash, a
replay, a re-encoding) is counted as a duplicate, not dead-lettered: it changes nothing, and a healthy rerun
must not look like an attack (exit 6). Other sets over the quota are dead-lettered as duplicates, and a
multi-message set without exactly one presence marker or flooding a channel is dead-lettered. What is kept
leaves as units (one device's kept sets) under sub-keys drawn by a keyed PRF of (device, crowd), with no
device identity.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from transforms.io.dead_letters import dead_letter
from transforms.io.staging import Location
from transforms.mechanisms.base import is_single_message, messages_per_channel
from transforms.mechanisms.randomness import keyed_indices
from transforms.shuffler.elements import DEAD, NAMESPACE
from transforms.shuffler.packed import Message, PackedUnits
from transforms.shuffler.packed_sets import PackedSets
from transforms.shuffler.plan import WindowClock
from transforms.shuffler.spill import SpillBuffer, load
from transforms.spec import AnalysisSpec, SpecSet
from transforms.wire.rows import PRESENCE

HELD = "held"
Unit = tuple[int, tuple[Message, ...]]  # one device's kept sets in a window: (set count, their messages)


class DedupeAndStripFn(beam.DoFn):
    """((spec, crowd, window, bucket), [packed sets]) -> kept sets under sub-keys, or held.

    The packed sets are pickled ``PackedSets`` or ``SpillRef``s to them (``IngressFn``). Open windows: every
    set is held (its offset leaves on ``HELD`` so the next run re-reads it). Closed windows: one set per
    device (``quota`` per window), identity stripped; what leaves is ((spec, crowd, window), (sub-key,
    PackedUnits)): per sub-key, the bucket's devices packed into arrays, each with its rank (a keyed PRF of
    the device) that orders the sub-crowd canonically -- or, given ``spill``, a ``SpillRef`` to them.
    """

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes, clock: WindowClock,
                 subkeys: Mapping[str, int] | None = None, spill: Location | None = None):
        self._specs = SpecSet(specs)
        self._key, self._clock = key, clock
        self._subkeys = dict(subkeys or {})  # spec_id -> sub-keys per crowd (default: the spec's)
        self._spill = str(spill) if spill else None
        self._buffer: SpillBuffer | None = None
        self._watermark: tuple[int | None] | None = None
        self._held = Metrics.counter(NAMESPACE, "sets_held")
        self._valid = Metrics.counter(NAMESPACE, "sets_valid")
        self._devices = Metrics.counter(NAMESPACE, "distinct_devices")
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._copies = Metrics.counter(NAMESPACE, "sets_duplicate")

    def start_bundle(self) -> None:
        if self._spill:
            self._buffer = SpillBuffer(self._spill, PackedUnits.concat, lambda u: len(u.messages.payload) + 28 * len(u))

    def finish_bundle(self) -> Iterator[Any]:
        if self._buffer is not None:
            for (crowd_key, subkey), ref in self._buffer.flush():
                yield GlobalWindows.windowed_value((crowd_key, (subkey, ref)))

    def _reject(self, sets: PackedSets, row: int, reason: str) -> TaggedOutput:
        self._dead.inc()
        return TaggedOutput(DEAD, dead_letter("shuffle", reason, source=sets.source(row), spec_id=sets.spec_id))

    def process(self, keyed: tuple[tuple[str, str | None, int, int], Iterable[Any]],
                run_times: Mapping[str, int] | None = None) -> Iterator[Any]:
        (spec_id, _, window_end, _), values = keyed
        loaded = [load(v) for v in values]
        if not loaded:
            return  # an empty pane: a streaming runner's closing pane (Beam's EMIT_ALWAYS), nothing to do
        spec = self._specs[spec_id]
        if self._watermark is None:
            self._watermark = (self._clock.watermark(run_times or {}),)
        sets = PackedSets.concat(loaded)
        del loaded
        if not self._clock.closed(window_end, spec.allowed_lateness_seconds * 1000, self._watermark[0]):
            self._held.inc(len(sets))
            earliest = np.full(len(sets.sources), np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(earliest, sets.source_index, sets.offsets)
            for (topic, partition), offset in zip(sets.sources, earliest.tolist(), strict=True):
                if offset != np.iinfo(np.int64).max:
                    yield TaggedOutput(HELD, (f"{topic}/{partition}", offset))
            return
        yield from self._dedupe(spec, sets)

    def _dedupe(self, spec: AnalysisSpec, sets: PackedSets) -> Iterator[Any]:
        """Keep each device's earliest sets (up to its quota), dead-letter the rest; emit units per sub-key.

        Vectorized for the common case, a device with one set of a single-message mechanism: kept as it is
        (nothing to compare it with, no per-set check). Only devices with several sets, or sets of several
        messages, go through the loop; the outcome is the same set by set as the loop over every device."""
        spec_id, crowd, window_end = sets.spec_id, sets.crowd_id, sets.window_end_ms
        order = sets.arrival_order()
        devices = sets.devices[order]
        starts = np.flatnonzero(np.concatenate([[True], np.any(devices[1:] != devices[:-1], axis=1)])) \
            if len(order) else np.zeros(0, np.int64)
        ends = np.append(starts[1:], len(order)).astype(np.int64)
        single = is_single_message(spec.randomizer)
        per_channel = messages_per_channel(spec.randomizer)
        quota = spec.max_reports_per_client
        subkeys = self._subkeys.get(spec_id, spec.crowd.subkeys)
        n_kept = np.zeros(len(starts), dtype=np.int64)  # per device (in device order): its sets kept
        lone = (ends - starts == 1) if single and quota >= 1 else np.zeros(len(starts), dtype=bool)
        n_kept[lone] = 1
        slow_kept: list[tuple[int, list[int]]] = []  # (device, its kept rows) of the devices looped over
        digests = sets.digests
        for device in np.flatnonzero(~lone).tolist():
            first, stop = int(starts[device]), int(ends[device])
            kept_digests: set[bytes] = set()
            kept_rows: list[int] = []
            for row in order[first:stop].tolist():
                digest = digests[row].tobytes() if stop - first > 1 else b""
                if digest in kept_digests:  # a copy of *any* kept set, not only the first: counted, harmless
                    self._copies.inc()
                    continue
                if len(kept_rows) >= quota:
                    yield self._reject(sets, row, f"duplicate: the device already sent {quota} set(s) in this "
                                                  "window")
                    continue
                problem = None if single else set_problem(self._messages_of(sets, row), per_channel)
                if problem:
                    yield self._reject(sets, row, problem)
                    continue
                kept_digests.add(digest)
                kept_rows.append(row)
            n_kept[device] = len(kept_rows)
            slow_kept.append((device, kept_rows))
        self._devices.inc(len(starts))
        self._valid.inc(int(n_kept.sum()))
        # One unit per device: the threshold counts, and deletes, devices (its noise is calibrated to one
        # device changing the count by one), whatever its quota of sets per window.
        units_of = np.flatnonzero(n_kept)  # the devices with a unit, in device order
        if not len(units_of):
            return
        n_sets = n_kept[units_of].astype(np.int32)
        row_start = np.concatenate([[0], np.cumsum(n_sets)[:-1]]).astype(np.int64)
        kept = np.empty(int(n_sets.sum()), dtype=np.int64)  # kept rows, device by device, each in arrival order
        first_kept = np.zeros(len(starts), dtype=np.int64)
        first_kept[units_of] = row_start
        kept[first_kept[lone]] = order[starts[lone]]
        for device, rows in slow_kept:
            if rows:
                kept[first_kept[device]:first_kept[device] + len(rows)] = rows
        # One keyed PRF value per device: its sub-key, and its rank in the sub-crowd's canonical order.
        ids_hex = sets.devices[order[starts[units_of]]].tobytes().hex().encode("ascii")
        rank_array = keyed_indices(self._key, f"{spec_id}/{crowd}/{window_end}/", ids_hex, 2 * sets.devices.shape[1])
        unit_of_row = np.repeat(np.arange(len(n_sets)), n_sets)
        n_messages = np.bincount(unit_of_row, weights=sets.n_messages[kept], minlength=len(n_sets)).astype(np.int32)
        subkey_of = (rank_array % np.uint64(subkeys)).astype(np.int64)
        for subkey in np.unique(subkey_of).tolist():
            units = np.flatnonzero(subkey_of == subkey)
            rows = kept[np.concatenate([np.arange(row_start[u], row_start[u] + n_sets[u]) for u in units])] \
                if n_sets.max() > 1 else kept[units]
            packed = PackedUnits(n_sets[units], n_messages[units], sets.messages.take(sets.message_rows(rows)),
                                 rank_array[units])
            if self._buffer is not None:
                for (crowd_key, sub), ref in self._buffer.add(((spec_id, crowd, window_end), subkey), packed):
                    yield crowd_key, (sub, ref)
            else:
                yield (spec_id, crowd, window_end), (subkey, packed)

    @staticmethod
    def _messages_of(sets: PackedSets, row: int) -> tuple[Message, ...]:
        rows = sets.message_rows(np.asarray([row]))
        return tuple(sets.messages[int(i)] for i in rows)


def set_problem(messages: tuple[Message, ...], per_channel_limit: int) -> str | None:
    """Why a multi-message set cannot be used as it is, or None."""
    per_channel: dict[int, int] = {}
    for channel, _ in messages:
        per_channel[channel] = per_channel.get(channel, 0) + 1
    if per_channel.get(PRESENCE, 0) != 1:
        return f"message set with {per_channel.get(PRESENCE, 0)} presence markers (expected exactly 1)"
    flooded = [c for c, k in per_channel.items() if c != PRESENCE and k > per_channel_limit]
    if flooded:
        return (f"flood: {per_channel[flooded[0]]} messages on channel {flooded[0]} in one set "
                f"(at most {per_channel_limit})")
    return None

