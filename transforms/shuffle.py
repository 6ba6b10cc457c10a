"""The shuffler (DESIGN.md §5): reports in, anonymous thresholded permuted batches out.

Per (window, spec, channel) crowd:

1. reports are windowed on event time (FixedWindows, fire once at the watermark, no late or early
   panes: a late pane would release a report alone, an early one a partial crowd);
2. one report per (client, channel, window) is kept -- the earliest, by event time then Kafka offset,
   so a retry keeps the same one -- and the rest are dead-lettered as duplicates (clients are grouped
   by a stable hash bucket, so this costs a few keys per window, not one key per client);
3. identity is stripped: from here on a report is its payload alone, in lists under random sub-keys;
4. the crowd threshold of 001 Algorithm 3: n_hat = floor(max(n + DLap(2/eps) - T, 0)) with a discrete
   (two-sided geometric) Laplace; n - n_hat uniformly chosen reports are deleted, allotted to the
   sub-keys by a multivariate hypergeometric draw so no worker ever holds a whole crowd; a crowd with
   n_hat = 0 releases nothing, and n_hat > n aborts the crowd (explicitly, never clamped: a clamp would
   change delta);
5. each sub-crowd is permuted and emitted as ``ShuffledBatch``es stamped with the window end.

``beam.Reshuffle`` is not used: it keeps timestamps and draws keys from ``random``. Counters in the
``esa`` namespace account for every report: ``reports_valid`` = ``reports_deleted`` + released.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms import trigger, window

from transforms.mechanisms.randomness import os_entropy_rng, seeded_rng
from transforms.privacy.crowd import crowd_threshold
from transforms.records import ReportElement, ShuffledBatch, dead_letter, rows_to_array
from transforms.spec import AnalysisSpec

LOG = logging.getLogger(__name__)
NAMESPACE = "esa"
DEAD = "dead_letters"
WITHHELD = -1  # decision for a crowd that releases nothing
DEDUPE_BUCKETS = 64  # client-hash buckets per (window, channel) for deduplication


def _rng(seed: int | None, salt: int) -> np.random.Generator:
    """OS entropy in production; a seed (tests only) is mixed with a per-stage salt."""
    return os_entropy_rng() if seed is None else seeded_rng(seed * 1_000_003 + salt)


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


class DedupeAndStripFn(beam.DoFn):
    """((channel, bucket), reports) -> ((channel, random sub-key), [payload rows]) + duplicate dead letters.

    Keeps each client's first ``quota`` reports (earliest event time, then Kafka position, so a retry
    keeps the same ones), counts distinct clients, and strips identity: what leaves is payloads only,
    scattered over random sub-keys.
    """

    def __init__(self, quota: int, subkeys: int, seed: int | None):
        self._quota, self._subkeys, self._seed = quota, subkeys, seed
        self._rng: np.random.Generator | None = None
        self._valid = Metrics.counter(NAMESPACE, "reports_valid")
        self._clients = Metrics.counter(NAMESPACE, "distinct_clients")
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")

    def setup(self) -> None:
        self._rng = _rng(self._seed, 1)

    def process(self, keyed: tuple[tuple[int, int], Iterable[ReportElement]]) -> Iterator[Any]:
        (channel, _), reports = keyed
        by_client: dict[str, list[ReportElement]] = {}
        for report in reports:
            by_client.setdefault(report.client_id, []).append(report)
        kept: list[tuple] = []
        for client, mine in by_client.items():
            if len(mine) > 1:
                mine.sort(key=lambda r: (r.event_time_ms, r.source or ("", -1, -1)))
            kept.extend(r.payload for r in mine[:self._quota])
            for dup in mine[self._quota:]:
                self._dead.inc()
                yield TaggedOutput(DEAD, dead_letter(
                    "shuffle", f"duplicate: client {client} already sent {self._quota} report(s) on channel "
                    f"{channel} in this window", original=dup.original, source=dup.source, spec_id=dup.spec_id))
        self._clients.inc(len(by_client))
        self._valid.inc(len(kept))
        subkeys = self._rng.integers(self._subkeys, size=len(kept))
        for key in np.unique(subkeys).tolist():
            yield (channel, key), [kept[i] for i in np.flatnonzero(subkeys == key)]


class CrowdThresholdFn(beam.DoFn):
    """(channel, [(sub-key, count)]) -> ((channel, sub-key), reports to delete, or WITHHELD)."""

    def __init__(self, spec: AnalysisSpec, seed: int | None):
        self._crowd, self._spec_id, self._seed = spec.crowd, spec.spec_id, seed
        self._rng: np.random.Generator | None = None
        self._released = Metrics.counter(NAMESPACE, "crowds_released")
        self._suppressed = Metrics.counter(NAMESPACE, "crowds_suppressed")
        self._aborted = Metrics.counter(NAMESPACE, "crowds_aborted")

    def setup(self) -> None:
        self._rng = _rng(self._seed, 2)

    def process(self, keyed: tuple[int, Iterable[tuple[int, int]]],
                win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[tuple[tuple[int, int], int]]:
        channel, parts = keyed
        subkeys, counts = zip(*sorted(parts), strict=True)
        n = int(sum(counts))
        n_hat = noisy_crowd_target(n, discrete_laplace(self._rng, self._crowd.epsilon),
                                   crowd_threshold(self._crowd.epsilon, self._crowd.delta))
        if n_hat > n or n_hat == 0:
            # Both outcomes release nothing; only the shuffler's own log and counters know why.
            (self._aborted if n_hat > n else self._suppressed).inc()
            LOG.info("crowd %s channel %d window ending %s withheld (%s)", self._spec_id, channel,
                     win.end.to_utc_datetime(), "aborted" if n_hat > n else "below threshold")
            for key in subkeys:
                yield (channel, key), WITHHELD
            return
        self._released.inc()
        deletions = self._rng.multivariate_hypergeometric(np.asarray(counts, dtype=np.int64), n - n_hat)
        for key, d in zip(subkeys, deletions.tolist(), strict=True):
            yield (channel, key), int(d)


class ReleaseFn(beam.DoFn):
    """Join a sub-crowd with its decision: delete, permute, emit batches stamped with the window end."""

    def __init__(self, spec: AnalysisSpec, batch_size: int, seed: int | None):
        self._spec, self._batch_size, self._seed = spec, batch_size, seed
        self._rng: np.random.Generator | None = None
        self._deleted = Metrics.counter(NAMESPACE, "reports_deleted")
        self._released = Metrics.counter(NAMESPACE, "reports_released")

    def setup(self) -> None:
        self._rng = _rng(self._seed, 3)

    def process(self, keyed: tuple[tuple[int, int], dict[str, list]],
                win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[window.TimestampedValue]:
        (channel, _), joined = keyed
        rows = [row for part in joined["reports"] for row in part]
        decisions = list(joined["decision"])
        if len(decisions) != 1:
            raise RuntimeError(f"sub-crowd has {len(decisions)} threshold decisions, expected exactly 1")
        decision = decisions[0]
        if decision == WITHHELD:
            self._deleted.inc(len(rows))
            return
        order = self._rng.permutation(len(rows))[decision:]  # one draw: which survive, and their order
        self._deleted.inc(decision)
        self._released.inc(len(order))
        window_end_ms = win.end.micros // 1000
        deleted = decision if self._spec.crowd.publish_deletions else None
        if not len(order) and deleted is None:
            return
        for start in range(0, max(len(order), 1), self._batch_size):
            batch = rows_to_array(self._spec.randomizer, [rows[i] for i in order[start:start + self._batch_size]])
            yield window.TimestampedValue(
                ShuffledBatch(self._spec.spec_id, channel, window_end_ms, batch, deleted if start == 0 else 0),
                win.max_timestamp())


class Shuffle(beam.PTransform):
    """ReportElements of one spec -> (ShuffledBatches, dead letters). See the module docstring."""

    def __init__(self, spec: AnalysisSpec, *, batch_size: int = 4096, seed: int | None = None):
        super().__init__()
        self._spec, self._batch_size, self._seed = spec, batch_size, seed
        if seed is not None:
            LOG.warning("shuffler randomness seeded (%d): for tests and simulations only", seed)

    def expand(self, reports: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        spec = self._spec
        windowed = (
            reports
            | "EventTime" >> beam.Map(lambda r: window.TimestampedValue(r, r.event_time_ms / 1000.0))
            | "FixedWindows" >> beam.WindowInto(
                window.FixedWindows(spec.window_seconds),
                trigger=trigger.AfterWatermark(),
                allowed_lateness=0,
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
        )
        deduped = (
            windowed
            | "KeyByClientBucket" >> beam.Map(lambda r: ((r.channel, client_bucket(r.client_id, DEDUPE_BUCKETS)), r))
            | "GroupByClientBucket" >> beam.GroupByKey()
            | "DedupeAndStrip" >> beam.ParDo(DedupeAndStripFn(spec.max_reports_per_client, spec.crowd.subkeys,
                                                              self._seed)).with_outputs(DEAD, main="kept")
        )
        stripped = deduped.kept
        decisions = (
            stripped
            | "PartSizes" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
            | "SubcrowdSizes" >> beam.CombinePerKey(sum)
            | "KeyByCrowd" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupCrowd" >> beam.GroupByKey()
            | "Threshold" >> beam.ParDo(CrowdThresholdFn(spec, self._seed))
        )
        released = (
            {"reports": stripped, "decision": decisions}
            | "JoinDecisions" >> beam.CoGroupByKey()
            | "DeleteAndPermute" >> beam.ParDo(ReleaseFn(spec, self._batch_size, self._seed))
        )
        # Dead letters leave the event-time windows so they can be merged with those of other stages.
        dead = deduped[DEAD] | "DeadLettersGlobal" >> beam.WindowInto(window.GlobalWindows())
        return released, dead
