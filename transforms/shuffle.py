"""The shuffler: authenticated message sets in, anonymous thresholded permuted release parts out.

Windows are explicit keys, not Beam windows: a crowd is one (spec, crowd id, window end), and whether
its window is *closed* is decided from the event-time watermark of the run (``WindowClock``), so the cost
of a run grows with its records, not with its number of distinct windows, and the same graph gives the
same releases on any runner. Per closed crowd:

1. one message set per (device, window) is kept -- the earliest by event time, then Kafka position, so
   a rerun keeps the same one -- byte-identical copies (replays, retried sends) and later sets are
   dead-lettered as duplicates; a set without exactly one presence marker, or with more messages on a
   channel than the mechanism sends, is dead-lettered (multi-message mechanisms);
2. identity is stripped: from here on a set is its sealed messages alone, under sub-keys drawn by a
   keyed PRF of (device, crowd), so no worker holds a whole crowd;
3. the crowd threshold of [ESA] Algorithm 3: n_hat = floor(max(n + DLap(2/eps) - T, 0)) with a discrete
   Laplace; n - n_hat uniformly chosen sets (whole devices) are deleted, allotted to sub-keys by a
   multivariate hypergeometric draw; n_hat below the spec's ``min_clients`` releases nothing, and
   n_hat > n aborts the crowd (never clamped: a clamp would change delta);
4. each sub-crowd's surviving messages are broken out of their sets and permuted, then leave as
   ``ReleasePart``s. Payloads are sealed to the analyzer: the shuffler routes what it cannot read.

Sets of windows still open are *held*: nothing is released, and the job's driver resumes the next run
at the earliest held offset of each partition, so an open window's sets are read again with the new
ones (and deduplicated together) when it closes. All randomness (sub-keys, threshold noise, deletions,
permutations) is a keyed PRF of the crowd under the shuffler's persisted key, so a rerun of the same
sets reproduces the same release. ``beam.Reshuffle`` is not used: it keeps timestamps and draws keys
from ``random``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsDict, TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from transforms.ingress import DEAD, NAMESPACE
from transforms.mechanisms.base import is_single_message, messages_per_channel
from transforms.mechanisms.randomness import keyed_generator, keyed_index
from transforms.packed import PackedMessages, PackedUnits
from transforms.packed_sets import PackedSets
from transforms.privacy.crowd import crowd_threshold
from transforms.records import PRESENCE, dead_letter
from transforms.spec import AnalysisSpec
from transforms.spill import SpillBuffer, count_of, load
from transforms.staging import Location
from transforms.state.run_state import watermark_ms

LOG = logging.getLogger(__name__)
HELD = "held"
WITHHELD = -1  # decision for a crowd that releases nothing
CrowdKey = tuple[str, str | None, int]  # (spec_id, crowd_id, window_end_ms)
Message = tuple[int, bytes]  # (channel, sealed payload)
Unit = tuple[int, tuple[Message, ...]]  # one device's kept sets in a window: (set count, their messages)


def discrete_laplace(rng: np.random.Generator, epsilon: float) -> int:
    """One draw of the two-sided geometric law P(k) ∝ exp(-|k| eps/2): the integer Laplace(2/eps).

    The difference of two i.i.d. geometric variables; integer arithmetic avoids the floating-point
    Laplace attacks on the low bits of a noisy count.
    """
    p = -math.expm1(-epsilon / 2.0)
    return int(rng.geometric(p)) - int(rng.geometric(p))


def noisy_crowd_target(n: int, noise: int, threshold: float) -> int:
    """[ESA] Algorithm 3: n_hat = floor(max(n + noise - T, 0))."""
    return max(math.floor(n + noise - threshold), 0)


RECORDS_PER_BUCKET = 20_000  # a dedupe group (Python objects on one worker) of about this many sets
RECORDS_PER_SUBKEY = 250_000  # a sub-crowd (delete-and-permute on one worker) of about this many sets
MAX_BUCKETS = 65_536
MAX_SUBKEYS = 4096  # the spec's own bound on [crowd] subkeys


def _pow2_at_least(x: float) -> int:
    return 1 << max(math.ceil(math.log2(x)), 0) if x > 1 else 1


@dataclass(frozen=True)
class ScaleOut:
    """How widely one run spreads its work, derived from the records it planned to read.

    ``buckets``: device-hash buckets per (crowd, window) for dedupe, so each dedupe group stays near
    ``RECORDS_PER_BUCKET`` sets even when a whole run is one window; a distributed runner spreads groups over
    workers. Releases do not depend on it (units are put in rank order), so any run may pick any value.
    ``subkeys(spec)``: sub-keys per crowd, at least the spec's ``[crowd] subkeys``, more for a run above
    ``RECORDS_PER_SUBKEY`` sets per spec sub-key, so no worker holds more than a bounded slice of a crowd.
    The sub-key count is part of a release (deletions are allotted per sub-crowd), hence powers of two: a
    rerun of a crashed attempt that plans a little more data keeps the same count; one that crosses a power
    of two produces a different release, which the ledger refuses (the sealed one is republished).
    """

    records: int

    @property
    def buckets(self) -> int:
        from transforms.ingress import DEDUPE_BUCKETS

        return min(max(_pow2_at_least(self.records / RECORDS_PER_BUCKET), DEDUPE_BUCKETS), MAX_BUCKETS)

    def subkeys(self, spec: AnalysisSpec) -> int:
        derived = _pow2_at_least(self.records / RECORDS_PER_SUBKEY)
        return min(max(derived, spec.crowd.subkeys), max(MAX_SUBKEYS, spec.crowd.subkeys))


class ReleasePart(NamedTuple):
    """The released, permuted messages of one sub-crowd; the driver numbers, signs and publishes them."""

    spec_id: str
    crowd_id: str | None
    window_end_ms: int
    subkey: int
    messages: Sequence[Message]  # a PackedMessages when released by ReleaseFn; () when withheld
    n_sets: int
    deleted: int | None  # devices the threshold deleted from this sub-crowd, if the spec publishes it


@dataclass(frozen=True)
class WindowClock:
    """Decides which windows are closed in this run: window end + allowed lateness <= watermark.

    The watermark is min over active partitions of (max authenticated event time - out-of-orderness),
    over this run's records and what earlier runs saw (``state.run_state.watermark_ms``); ``drain``
    closes every window (end of a bounded backfill, or an operator's explicit drain).
    """

    now_ms: int
    out_of_orderness_ms: int
    idle_timeout_ms: int
    prior_max_event_ms: Mapping[str, int] = field(default_factory=dict)
    prior_last_data_wall_ms: Mapping[str, int] = field(default_factory=dict)
    drain: bool = False

    def watermark(self, run_max_event_ms: Mapping[str, int]) -> int | None:
        if self.drain:
            return None
        max_event = dict(self.prior_max_event_ms)
        last_wall = dict(self.prior_last_data_wall_ms)
        for pkey, event_ms in run_max_event_ms.items():
            max_event[pkey] = max(max_event.get(pkey, event_ms), event_ms)
            last_wall[pkey] = self.now_ms
        return watermark_ms(max_event, last_wall, self.now_ms, self.out_of_orderness_ms, self.idle_timeout_ms)

    def closed(self, window_end_ms: int, lateness_ms: int, watermark: int | None) -> bool:
        return self.drain or (watermark is not None and window_end_ms + lateness_ms <= watermark)


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
        self._specs = {s.spec_id: s for s in specs}
        self._key, self._clock = key, clock
        self._subkeys = dict(subkeys or {})  # spec_id -> sub-keys per crowd (default: the spec's)
        self._spill = str(spill) if spill else None
        self._buffer: SpillBuffer | None = None
        self._watermark: tuple[int | None] | None = None
        self._held = Metrics.counter(NAMESPACE, "sets_held")
        self._valid = Metrics.counter(NAMESPACE, "sets_valid")
        self._devices = Metrics.counter(NAMESPACE, "distinct_devices")
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")

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
                run_times: Mapping[str, int]) -> Iterator[Any]:
        (spec_id, _, window_end, _), values = keyed
        spec = self._specs[spec_id]
        if self._watermark is None:
            self._watermark = (self._clock.watermark(run_times),)
        sets = PackedSets.concat([load(v) for v in values])
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
        """Keep each device's earliest sets (up to its quota), dead-letter the rest; emit units per sub-key."""
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
        kept_rows: list[int] = []  # rows kept, device by device, each device's in arrival order
        unit_sets: list[int] = []
        ranks: list[int] = []
        digests = sets.digests
        for first, stop in zip(starts.tolist(), ends.tolist(), strict=True):
            rows = order[first:stop].tolist()
            n_kept, kept_digests = 0, set()
            for row in rows:
                digest = digests[row].tobytes() if stop - first > 1 else b""
                if digest in kept_digests:  # a copy of *any* kept set, not only the first
                    yield self._reject(sets, row, "duplicate: an identical copy of a set already kept (replay or "
                                                  "resend)")
                    continue
                if n_kept >= quota:
                    yield self._reject(sets, row, f"duplicate: the device already sent {quota} set(s) in this "
                                                  "window")
                    continue
                problem = None if single else set_problem(self._messages_of(sets, row), per_channel)
                if problem:
                    yield self._reject(sets, row, problem)
                    continue
                n_kept += 1
                kept_digests.add(digest)
                kept_rows.append(row)
            if n_kept:
                # One unit per device: the threshold counts, and deletes, devices (its noise is calibrated to
                # one device changing the count by one), whatever its quota of sets per window.
                # One keyed PRF value per device: its sub-key, and its rank in the sub-crowd's canonical order.
                device = sets.devices[rows[0]].tobytes().hex()
                ranks.append(keyed_index(self._key, f"{spec_id}/{crowd}/{window_end}/{device}", 1 << 64))
                unit_sets.append(n_kept)
        self._devices.inc(len(starts))
        self._valid.inc(len(kept_rows))
        if not unit_sets:
            return
        kept = np.asarray(kept_rows, dtype=np.int64)
        n_sets = np.asarray(unit_sets, dtype=np.int32)
        unit_of_row = np.repeat(np.arange(len(n_sets)), n_sets)
        n_messages = np.bincount(unit_of_row, weights=sets.n_messages[kept], minlength=len(n_sets)).astype(np.int32)
        rank_array = np.asarray(ranks, dtype=np.uint64)
        subkey_of = (rank_array % np.uint64(subkeys)).astype(np.int64)
        row_start = np.concatenate([[0], np.cumsum(n_sets)[:-1]]).astype(np.int64)
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


class CrowdThresholdFn(beam.DoFn):
    """(crowd key, [(sub-key, set count)]) -> ((crowd key, sub-key), sets to delete, or WITHHELD)."""

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes):
        self._specs = {s.spec_id: s for s in specs}
        self._key = key
        self._released = Metrics.counter(NAMESPACE, "crowds_released")
        self._suppressed = Metrics.counter(NAMESPACE, "crowds_suppressed")
        self._aborted = Metrics.counter(NAMESPACE, "crowds_aborted")

    def process(self, keyed: tuple[CrowdKey, Iterable[tuple[int, int]]]) -> Iterator[tuple[tuple[CrowdKey, int], int]]:
        crowd_key, parts = keyed
        spec_id, crowd, window_end = crowd_key
        crowd_spec = self._specs[spec_id].crowd
        subkeys, counts = zip(*sorted(parts), strict=True)
        n = int(sum(counts))
        rng = keyed_generator(self._key, "threshold", spec_id, str(crowd), window_end)
        n_hat = noisy_crowd_target(n, discrete_laplace(rng, crowd_spec.epsilon),
                                   crowd_threshold(crowd_spec.epsilon, crowd_spec.delta))
        if n_hat > n or n_hat < max(crowd_spec.min_clients, 1):
            # Both outcomes release nothing; only the shuffler's own log and counters know why.
            (self._aborted if n_hat > n else self._suppressed).inc()
            LOG.info("crowd %s/%s window ending %d withheld (%s)", spec_id, crowd, window_end,
                     "aborted" if n_hat > n else "below threshold")
            for key in subkeys:
                yield (crowd_key, key), WITHHELD
            return
        self._released.inc()
        deletions = rng.multivariate_hypergeometric(np.asarray(counts, dtype=np.int64), n - n_hat)
        for key, d in zip(subkeys, deletions.tolist(), strict=True):
            yield (crowd_key, key), int(d)


class ReleaseFn(beam.DoFn):
    """Join a sub-crowd with its decision: delete whole sets, permute the messages, emit a ReleasePart.

    Messages are permuted *after* the sets are broken up, so no position links two messages of a device.
    """

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes):
        self._specs = {s.spec_id: s for s in specs}
        self._key = key
        self._deleted = Metrics.counter(NAMESPACE, "sets_deleted")
        self._released = Metrics.counter(NAMESPACE, "sets_released")
        self._messages = Metrics.counter(NAMESPACE, "messages_released")

    def process(self, keyed: tuple[tuple[CrowdKey, int], dict[str, list]]) -> Iterator[ReleasePart]:
        (crowd_key, subkey), joined = keyed
        spec_id, crowd, window_end = crowd_key
        # canonical (rank) order: GroupByKey's is not; plain lists of units (tests) are sorted
        loaded = [load(p) for p in joined["sets"]]
        units = PackedUnits.concat([p if isinstance(p, PackedUnits) else PackedUnits.of(sorted(p)) for p in loaded])
        del loaded
        decisions = list(joined["decision"])
        if len(decisions) != 1:
            raise RuntimeError(f"sub-crowd has {len(decisions)} threshold decisions, expected exactly 1")
        decision = decisions[0]
        total_sets = int(units.n_sets.sum())
        if decision == WITHHELD:
            self._deleted.inc(total_sets)
            # An empty part says "this window closed and released nothing": the driver records it in the
            # ledger, so later reports for the window are late instead of forming a new crowd.
            yield ReleasePart(spec_id, crowd, window_end, subkey, (), 0, None)
            return
        rng = keyed_generator(self._key, "release", spec_id, str(crowd), subkey, window_end)
        survivors = rng.permutation(len(units))[decision:]  # one draw: which devices survive
        rows = units.messages_of(survivors)  # their messages, unit by unit
        released_sets = int(units.n_sets[survivors].sum())
        order = rng.permutation(len(rows))
        self._deleted.inc(total_sets - released_sets)
        self._released.inc(released_sets)
        self._messages.inc(len(rows))
        published = self._specs[spec_id].crowd.publish_deletions
        messages: PackedMessages = units.messages.take(rows[order])
        yield ReleasePart(spec_id, crowd, window_end, subkey, messages, released_sets,
                          decision if published else None)


class Shuffle(beam.PTransform):
    """Authenticated sets (from ``IngressFn``) + per-partition event times -> (ReleaseParts, held, dead).

    ``held`` carries (partition key, earliest offset) of sets in windows that are still open. With ``spill``
    (a directory or URL every worker can write, e.g. under the run's staging location), the stripped units
    are spilled there and only references are grouped (``transforms.spill``).
    """

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes, clock: WindowClock,
                 subkeys: Mapping[str, int] | None = None, *, spill: Location | None = None):
        super().__init__()
        self._specs, self._key, self._clock = list(specs), key, clock
        self._subkeys = dict(subkeys or {})
        self._spill = spill

    def expand(self, inputs: tuple[beam.PCollection, beam.PCollection]) -> tuple[Any, Any, Any]:
        keyed_sets, times = inputs
        run_times = times | "MaxEventTime" >> beam.CombinePerKey(max)
        deduped = (
            keyed_sets
            | "GroupByDeviceBucket" >> beam.GroupByKey()
            | "DedupeAndStrip" >> beam.ParDo(DedupeAndStripFn(self._specs, self._key, self._clock, self._subkeys,
                                                                              self._spill),
                                             AsDict(run_times)).with_outputs(DEAD, HELD, main="kept")
        )
        stripped = deduped.kept | "BySubkey" >> beam.Map(lambda kv: ((kv[0], kv[1][0]), kv[1][1]))
        decisions = (
            stripped
            | "PartSizes" >> beam.Map(lambda kv: (kv[0], count_of(kv[1])))
            | "SubcrowdSizes" >> beam.CombinePerKey(sum)
            | "KeyByCrowd" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupCrowd" >> beam.GroupByKey()
            | "Threshold" >> beam.ParDo(CrowdThresholdFn(self._specs, self._key))
        )
        released = (
            {"sets": stripped, "decision": decisions}
            | "JoinDecisions" >> beam.CoGroupByKey()
            | "DeleteAndPermute" >> beam.ParDo(ReleaseFn(self._specs, self._key))
        )
        held = deduped[HELD] | "EarliestHeld" >> beam.CombinePerKey(min)
        return released, held, deduped[DEAD], run_times
