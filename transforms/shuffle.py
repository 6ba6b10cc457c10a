"""The shuffler (DESIGN.md §5): reports in, anonymous thresholded permuted batches out.

Per (window, spec, crowd id) crowd:

1. reports are windowed on event time (FixedWindows; one on-time pane at the watermark; no early panes,
   which would release partial crowds). Late panes are never released: their reports are counted and
   dead-lettered as late (reports later than the allowed lateness are dropped by Beam itself);
2. one message set per (client, window) is kept (``max_reports_per_window`` in the spec) -- the earliest,
   by event time then Kafka position, so a retry keeps the same one -- and the rest are dead-lettered as
   duplicates. A message set is one report, or all messages of one event of a multi-message mechanism
   (fragments on their channels plus one presence marker; excess messages per channel are a flood).
   Clients are grouped by a stable hash bucket: a few keys per window, not one key per client;
3. identity is stripped: from here on a report is its payload alone, in lists under random sub-keys;
4. the crowd threshold of 001 Algorithm 3: n_hat = floor(max(n + DLap(2/eps) - T, 0)) with a discrete
   (two-sided geometric) Laplace; n - n_hat uniformly chosen message sets (whole clients) are deleted,
   allotted to the sub-keys by a multivariate hypergeometric draw so no worker ever holds a whole crowd; a crowd with
   n_hat = 0 releases nothing, and n_hat > n aborts the crowd (explicitly, never clamped: a clamp would
   change delta);
5. each sub-crowd's surviving messages are permuted and emitted as ``ShuffledBatch``es stamped with the
   window end.

All shuffler randomness (sub-keys, threshold noise, deletions, permutation) is a keyed PRF of the crowd
under a secret shuffler key (OS entropy, or a seed in tests), so a retried or replayed bundle reproduces
exactly the same release (DESIGN.md §6). ``beam.Reshuffle`` is not used: it keeps timestamps and draws
keys from ``random``. Counters in the ``esa`` namespace account for every report:
``reports_valid`` = ``reports_deleted`` + ``reports_released``.
"""

from __future__ import annotations

import logging
import math
import pickle
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming

from transforms.mechanisms.base import is_single_message, messages_per_channel
from transforms.mechanisms.randomness import job_key_from_entropy, job_key_from_seed, keyed_generator, keyed_index
from transforms.privacy.crowd import crowd_threshold
from transforms.records import PRESENCE, ReportElement, ShuffledBatch, dead_letter, rows_to_array
from transforms.spec import AnalysisSpec

LOG = logging.getLogger(__name__)
NAMESPACE = "esa"
DEAD = "dead_letters"
WITHHELD = -1  # decision for a crowd that releases nothing
DEDUPE_BUCKETS = 64  # client-hash buckets per (window, crowd) for deduplication


def discrete_laplace(rng: np.random.Generator, epsilon: float) -> int:
    """One draw of the two-sided geometric law P(k) ∝ exp(-|k| eps/2): the integer Laplace(2/eps).

    The difference of two i.i.d. geometric variables; integer arithmetic avoids the floating-point
    Laplace attacks on the low bits of a noisy count.
    """
    p = -math.expm1(-epsilon / 2.0)
    return int(rng.geometric(p)) - int(rng.geometric(p))


def noisy_crowd_target(n: int, noise: int, threshold: float) -> int:
    """001 Algorithm 3: n_hat = floor(max(n + noise - T, 0))."""
    return max(math.floor(n + noise - threshold), 0)


def client_bucket(client_id: str, buckets: int) -> int:
    """Stable bucket of a client (CRC-32, identical on every worker; Python's ``hash`` is salted).

    Duplicates of one client always meet in one bucket, so deduplication needs a handful of keys per
    window instead of one per client (a windowed GroupByKey pays per-key trigger and timer work).
    """
    return zlib.crc32(client_id.encode("utf-8")) % buckets


def as_reports(element: ReportElement | list[ReportElement]) -> list[ReportElement]:
    """Stages accept a batch (list) of reports or a single report."""
    return element if isinstance(element, list) else [element]


class BucketByWindowFn(beam.DoFn):
    """A batch of reports -> one timestamped list per (window, crowd, client bucket).

    Grouping before the windowed GroupByKey keeps elements batched: every list lies in a single window
    (it carries the earliest event time of its reports), so Beam's window assignment and lateness rules
    apply to it exactly as to its reports.
    """

    def __init__(self, window_ms: int):
        self._window_ms = window_ms

    def process(self, element: ReportElement | list[ReportElement]) -> Iterator[window.TimestampedValue]:
        groups: dict[tuple[int, str | None, int], list[ReportElement]] = {}
        for report in as_reports(element):
            start = report.event_time_ms - report.event_time_ms % self._window_ms
            key = (start, report.crowd_id, client_bucket(report.client_id, DEDUPE_BUCKETS))
            groups.setdefault(key, []).append(report)
        for (_, crowd, bucket), reports in groups.items():
            first = min(r.event_time_ms for r in reports)
            # One pickle per list: Beam's coder would otherwise pickle every report on its own (5x slower).
            blob = pickle.dumps(reports, protocol=pickle.HIGHEST_PROTOCOL)
            yield window.TimestampedValue(((crowd, bucket), blob), Timestamp(micros=first * 1000))


def _position(report: ReportElement) -> tuple[int, tuple[str, int, int]]:
    """Order of arrival that does not depend on bundling: event time, then Kafka position."""
    return report.event_time_ms, report.source or ("", -1, -1)


class DedupeAndStripFn(beam.DoFn):
    """((crowd, bucket), [report lists]) -> ((crowd, sub-key), [message sets]) + dead letters.

    A *message set* is what one client sent for one event: a single report, or -- for mechanisms that
    send several messages -- every message with that event time (exactly one presence marker and at most
    ``messages_per_channel`` messages per channel). Keeps each client's first ``quota`` sets (earliest
    event time, then Kafka position, so a retry keeps the same ones), counts distinct clients, and strips
    identity: what leaves is tuples of payload rows, scattered over sub-keys drawn by a keyed PRF of
    (client, crowd, window). Late panes release nothing.
    """

    def __init__(self, spec: AnalysisSpec, key: bytes):
        mechanism = spec.randomizer
        self._spec_id, self._quota = spec.spec_id, spec.max_reports_per_client
        self._single = is_single_message(mechanism)
        self._per_channel = messages_per_channel(mechanism)
        self._subkeys, self._key = spec.crowd.subkeys, key
        self._valid = Metrics.counter(NAMESPACE, "reports_valid")
        self._clients = Metrics.counter(NAMESPACE, "distinct_clients")
        self._late = Metrics.counter(NAMESPACE, "reports_late")
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")

    def _reject(self, report: ReportElement, reason: str) -> TaggedOutput:
        self._dead.inc()
        return TaggedOutput(DEAD, dead_letter("shuffle", reason, original=report.original, source=report.source,
                                              spec_id=report.spec_id))

    def process(self, keyed: tuple[tuple[str | None, int], Iterable[bytes]],
                win: window.BoundedWindow = beam.DoFn.WindowParam,
                pane: Any = beam.DoFn.PaneInfoParam) -> Iterator[Any]:
        (crowd, _), blobs = keyed
        late = pane.timing == PaneInfoTiming.LATE
        by_client: dict[str, list[ReportElement]] = {}
        for report in (r for blob in blobs for r in pickle.loads(blob)):
            if late:
                self._late.inc()
                yield self._reject(report, f"late: arrived after its window (ending {win.end.micros // 1000}) closed")
            elif report.spec_id != self._spec_id:
                yield self._reject(report, f"report for spec {report.spec_id} reached the shuffler of {self._spec_id}")
            else:
                by_client.setdefault(report.client_id, []).append(report)
        kept: dict[int, list[tuple]] = {}
        for client, mine in by_client.items():
            sets = self._message_sets(mine)
            subkey = keyed_index(self._key, f"{win.start.micros}/{crowd}/{client}", self._subkeys)
            for i, message_set in enumerate(sets):
                if i >= self._quota:
                    for dup in message_set:
                        yield self._reject(dup, f"duplicate: client {client} already sent {self._quota} report(s) "
                                                "in this window")
                    continue
                problem = None if self._single else self._set_problem(message_set)
                if problem:
                    for report in message_set:
                        yield self._reject(report, f"{problem} (client {client})")
                    continue
                kept.setdefault(subkey, []).append(tuple(r.payload for r in message_set))
        self._clients.inc(len(by_client))
        self._valid.inc(sum(len(s) for sets in kept.values() for s in sets))
        for subkey, sets in kept.items():
            yield (crowd, subkey), sets

    def _message_sets(self, reports: list[ReportElement]) -> list[list[ReportElement]]:
        """One client's reports as message sets in arrival order (single-message: one report per set)."""
        reports.sort(key=_position)
        if self._single:
            return [[r] for r in reports]
        sets: dict[int, list[ReportElement]] = {}
        for report in reports:
            sets.setdefault(report.event_time_ms, []).append(report)
        return list(sets.values())

    def _set_problem(self, message_set: list[ReportElement]) -> str | None:
        """Why a multi-message set cannot be used as it is, or None."""
        per_channel: dict[int, int] = {}
        for report in message_set:
            per_channel[report.channel] = per_channel.get(report.channel, 0) + 1
        if per_channel.get(PRESENCE, 0) != 1:
            return f"message set with {per_channel.get(PRESENCE, 0)} presence markers (expected exactly 1)"
        flooded = [c for c, k in per_channel.items() if c != PRESENCE and k > self._per_channel]
        if flooded:
            return (f"flood: {per_channel[flooded[0]]} messages on channel {flooded[0]} for one event "
                    f"(at most {self._per_channel})")
        return None


class CrowdThresholdFn(beam.DoFn):
    """(crowd, [(sub-key, message sets)]) -> ((crowd, sub-key), message sets to delete, or WITHHELD)."""

    def __init__(self, spec: AnalysisSpec, key: bytes):
        self._crowd, self._spec_id, self._key = spec.crowd, spec.spec_id, key
        self._released = Metrics.counter(NAMESPACE, "crowds_released")
        self._suppressed = Metrics.counter(NAMESPACE, "crowds_suppressed")
        self._aborted = Metrics.counter(NAMESPACE, "crowds_aborted")

    def process(self, keyed: tuple[str | None, Iterable[tuple[int, int]]],
                win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[tuple[tuple[str | None, int], int]]:
        crowd, parts = keyed
        subkeys, counts = zip(*sorted(parts), strict=True)
        n = int(sum(counts))
        rng = keyed_generator(self._key, "threshold", self._spec_id, str(crowd), win.start.micros)
        n_hat = noisy_crowd_target(n, discrete_laplace(rng, self._crowd.epsilon),
                                   crowd_threshold(self._crowd.epsilon, self._crowd.delta))
        if n_hat > n or n_hat == 0:
            # Both outcomes release nothing; only the shuffler's own log and counters know why.
            (self._aborted if n_hat > n else self._suppressed).inc()
            LOG.info("crowd %s/%s window ending %s withheld (%s)", self._spec_id, crowd,
                     win.end.to_utc_datetime(), "aborted" if n_hat > n else "below threshold")
            for key in subkeys:
                yield (crowd, key), WITHHELD
            return
        self._released.inc()
        deletions = rng.multivariate_hypergeometric(np.asarray(counts, dtype=np.int64), n - n_hat)
        for key, d in zip(subkeys, deletions.tolist(), strict=True):
            yield (crowd, key), int(d)


class ReleaseFn(beam.DoFn):
    """Join a sub-crowd with its decision: delete whole message sets, permute messages, emit batches.

    Messages are permuted *after* the sets are broken up, so no position in a batch links two messages of
    one client; batches are stamped with the window end.
    """

    def __init__(self, spec: AnalysisSpec, batch_size: int, key: bytes):
        self._spec, self._batch_size, self._key = spec, batch_size, key
        self._deleted = Metrics.counter(NAMESPACE, "reports_deleted")
        self._released = Metrics.counter(NAMESPACE, "reports_released")

    def process(self, keyed: tuple[tuple[str | None, int], dict[str, list]],
                win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[window.TimestampedValue]:
        (crowd, subkey), joined = keyed
        sets = sorted(s for part in joined["reports"] for s in part)  # canonical order: GBK order is not
        decisions = list(joined["decision"])
        if len(decisions) != 1:
            raise RuntimeError(f"sub-crowd has {len(decisions)} threshold decisions, expected exactly 1")
        decision = decisions[0]
        if decision == WITHHELD:
            self._deleted.inc(sum(len(s) for s in sets))
            return
        rng = keyed_generator(self._key, "release", self._spec.spec_id, str(crowd), subkey, win.start.micros)
        survivors = rng.permutation(len(sets))[decision:]  # one draw: which sets survive
        rows = [row for i in survivors for row in sets[i]]
        order = rng.permutation(len(rows))
        self._deleted.inc(sum(len(s) for s in sets) - len(rows))
        self._released.inc(len(rows))
        window_end_ms = win.end.micros // 1000
        published = self._spec.crowd.publish_deletions
        if not len(order) and not published:
            return
        mechanism = self._spec.randomizer
        for start in range(0, max(len(order), 1), self._batch_size):
            batch = rows_to_array(mechanism, [rows[i] for i in order[start:start + self._batch_size]])
            deleted = (decision if start == 0 else 0) if published else None
            yield window.TimestampedValue(ShuffledBatch(self._spec.spec_id, crowd, window_end_ms, batch, deleted),
                                          win.max_timestamp())


class Shuffle(beam.PTransform):
    """ReportElements (or lists of them) of one spec -> (ShuffledBatches, dead letters). See the module doc."""

    def __init__(self, spec: AnalysisSpec, *, batch_size: int = 4096, seed: int | None = None):
        super().__init__()
        self._spec, self._batch_size = spec, batch_size
        if seed is not None:
            LOG.warning("shuffler randomness seeded (%d): for tests and simulations only", seed)
        self._key = job_key_from_seed(seed + 0x5EED) if seed is not None else job_key_from_entropy()

    def expand(self, reports: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        spec = self._spec
        windowed = (
            reports
            | "BucketByWindow" >> beam.ParDo(BucketByWindowFn(spec.window_seconds * 1000))
            | "FixedWindows" >> beam.WindowInto(
                window.FixedWindows(spec.window_seconds),
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                allowed_lateness=spec.allowed_lateness_seconds,
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
        )
        deduped = (
            windowed
            | "GroupByClientBucket" >> beam.GroupByKey()
            | "DedupeAndStrip" >> beam.ParDo(DedupeAndStripFn(spec, self._key)).with_outputs(DEAD, main="kept")
        )
        stripped = deduped.kept
        decisions = (
            stripped
            | "PartSizes" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
            | "SubcrowdSizes" >> beam.CombinePerKey(sum)
            | "KeyByCrowd" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupCrowd" >> beam.GroupByKey()
            | "Threshold" >> beam.ParDo(CrowdThresholdFn(spec, self._key))
        )
        released = (
            {"reports": stripped, "decision": decisions}
            | "JoinDecisions" >> beam.CoGroupByKey()
            | "DeleteAndPermute" >> beam.ParDo(ReleaseFn(spec, self._batch_size, self._key))
        )
        # Dead letters leave the event-time windows so they can be merged with those of other stages.
        dead = deduped[DEAD] | "DeadLettersGlobal" >> beam.WindowInto(window.GlobalWindows())
        return released, dead
