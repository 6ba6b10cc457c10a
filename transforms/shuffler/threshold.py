"""The shuffler's release steps per closed crowd: the noisy crowd threshold, then delete-and-permute.

``CrowdThresholdFn`` draws [ESA] Algorithm 3's n_hat = floor(max(n + DLap(2/eps) - T, 0)) per crowd and allots
the n - n_hat deletions (whole devices) to sub-keys by a multivariate hypergeometric draw; ``ReleaseFn``
applies them per sub-crowd and permutes the surviving messages into a ``ReleasePart``. All randomness is a
keyed PRF of the crowd, so a rerun of the same sets reproduces the same release. ``PartHeader`` is what the
driver needs of a staged part before its messages (``part_header``, staged beside it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from transforms.mechanisms.randomness import keyed_generator
from transforms.privacy.crowd import crowd_threshold
from transforms.privacy.crowd_count import discrete_gaussian
from transforms.shuffler.elements import NAMESPACE
from transforms.shuffler.packed import Message, PackedMessages, PackedUnits
from transforms.shuffler.spill import load
from transforms.spec import AnalysisSpec, SpecSet

LOG = logging.getLogger(__name__)
WITHHELD = -1  # decision for a crowd that releases nothing
CrowdKey = tuple[str, str | None, int]  # (spec_id, crowd_id, window_end_ms)


def discrete_laplace(rng: np.random.Generator, epsilon: float) -> int:
    """One draw of the two-sided geometric law P(k) ∝ exp(-|k| eps/2): the integer Laplace(2/eps).

    The difference of two i.i.d. geometric variables; integer arithmetic avoids the floating-point
    Laplace attacks on the low bits of a noisy count.
    """
    p = -math.expm1(-epsilon / 2.0)
    return int(rng.geometric(p)) - int(rng.geometric(p))


def _count_noise(rng: np.random.Generator, spec: AnalysisSpec) -> tuple[int, float]:
    """(noise, T) of the crowd count: the yearly-designed discrete Gaussian where a partition or membership
    claim makes the count cost privacy (``transforms.privacy.crowd_count``), else [ESA]'s discrete Laplace,
    which then only sets how many reports are deleted (the count does not change between neighbours)."""
    design = spec.crowd.count_design(spec.window_seconds)
    if design is not None:
        sigma, threshold = design
        return discrete_gaussian(rng, sigma), float(threshold)
    return discrete_laplace(rng, spec.crowd.epsilon), crowd_threshold(spec.crowd.epsilon, spec.crowd.delta)


def noisy_crowd_target(n: int, noise: int, threshold: float) -> int:
    """[ESA] Algorithm 3: n_hat = floor(max(n + noise - T, 0))."""
    return max(math.floor(n + noise - threshold), 0)


class ReleasePart(NamedTuple):
    """The released, permuted messages of one sub-crowd; the driver numbers, signs and publishes them."""

    spec_id: str
    crowd_id: str | None
    window_end_ms: int
    subkey: int
    messages: Sequence[Message]  # a PackedMessages when released by ReleaseFn; () when withheld
    n_sets: int
    deleted: int | None  # devices the threshold deleted from this sub-crowd, if the spec publishes it
    # Every set of the sub-crowd that reached its threshold decision (released + deleted): the streaming driver's
    # accounting after a runner restart, when the runner's counters hold only the last attempt (None: unknown).
    sets_in: int | None = None



class PartHeader(NamedTuple):
    """A release part without its messages: which release and sub-key, its counts, and the shape of its
    messages (one payload length for all, the range of their channels). Staged beside the part
    (``transforms.io.staging``) so the driver groups parts into releases, finds withheld windows and lays out a
    release's batches without reading any part's messages (``transforms.shuffler.release_files.write_release``)."""

    spec_id: str
    crowd_id: str | None
    window_end_ms: int
    subkey: int
    n_sets: int
    deleted: int | None
    n_messages: int
    width: int | None  # the payload length of every message; None if they differ (or there is none)
    channels: tuple[int, int] | None  # (lowest, highest) channel; None without messages
    sets_in: int | None = None  # as ReleasePart.sets_in


def part_header(part: ReleasePart) -> PartHeader:
    messages = PackedMessages.of(part.messages)
    width = messages.width()
    channels = (int(messages.channels.min()), int(messages.channels.max())) if len(messages) else None
    return PartHeader(part.spec_id, part.crowd_id, part.window_end_ms, part.subkey, part.n_sets, part.deleted,
                      len(messages), width, channels, part.sets_in)


class Decision(NamedTuple):
    """A sub-crowd's threshold decision with what a join needs to know it has all of the sub-crowd: how many
    units (a device's kept sets) the decision counted, and how many sub-crowds (release parts) the crowd has."""

    deletions: int  # units to delete, or WITHHELD
    n_units: int
    n_parts: int


class CrowdThresholdFn(beam.DoFn):
    """(crowd key, [(sub-key, set count)]) -> ((crowd key, sub-key), sets to delete, or WITHHELD); with
    ``counted`` a ``Decision`` instead of the bare number (``transforms.shuffler.release_join``)."""

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes, counted: bool = False):
        self._specs = SpecSet(specs)
        self._key = key
        self._counted = counted
        self._released = Metrics.counter(NAMESPACE, "crowds_released")
        self._suppressed = Metrics.counter(NAMESPACE, "crowds_suppressed")
        self._aborted = Metrics.counter(NAMESPACE, "crowds_aborted")

    def process(self, keyed: tuple[CrowdKey, Iterable[tuple[int, int]]]) -> Iterator[tuple[tuple[CrowdKey, int], Any]]:
        crowd_key, parts = keyed
        for key, deletions, n_units, n_parts in self._decide(crowd_key, parts):
            yield key, Decision(deletions, n_units, n_parts) if self._counted else deletions

    def _decide(self, crowd_key: CrowdKey, parts: Iterable[tuple[int, int]]
                ) -> Iterator[tuple[tuple[CrowdKey, int], int, int, int]]:
        parts = sorted(parts)
        if not parts:
            return  # an empty pane: a streaming runner's closing pane (Beam's EMIT_ALWAYS), nothing to decide
        spec_id, crowd, window_end = crowd_key
        crowd_spec = self._specs[spec_id].crowd
        counts = [count for _, count in parts]
        n = int(sum(counts))
        rng = keyed_generator(self._key, "threshold", spec_id, str(crowd), window_end)
        n_hat = noisy_crowd_target(n, *_count_noise(rng, self._specs[spec_id]))
        if n_hat > n or n_hat < max(crowd_spec.min_clients, 1):
            # Both outcomes release nothing; only the shuffler's own log and counters know why.
            (self._aborted if n_hat > n else self._suppressed).inc()
            LOG.info("crowd %s/%s window ending %d withheld (%s)", spec_id, crowd, window_end,
                     "aborted" if n_hat > n else "below threshold")
            for key, count in parts:
                yield (crowd_key, key), WITHHELD, count, len(parts)
            return
        self._released.inc()
        deletions = rng.multivariate_hypergeometric(np.asarray(counts, dtype=np.int64), n - n_hat)
        for (key, count), d in zip(parts, deletions.tolist(), strict=True):
            yield (crowd_key, key), int(d), count, len(parts)


class ReleaseFn(beam.DoFn):
    """Join a sub-crowd with its decision: delete whole sets, permute the messages, emit a ReleasePart.

    Messages are permuted *after* the sets are broken up, so no position links two messages of a device.
    """

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes):
        self._specs = SpecSet(specs)
        self._key = key
        self._deleted = Metrics.counter(NAMESPACE, "sets_deleted")
        self._released = Metrics.counter(NAMESPACE, "sets_released")
        self._messages = Metrics.counter(NAMESPACE, "messages_released")

    def process(self, keyed: tuple[tuple[CrowdKey, int], dict[str, list]]) -> Iterator[ReleasePart]:
        (crowd_key, subkey), joined = keyed
        # canonical (rank) order: GroupByKey's is not; plain lists of units (tests) are sorted
        loaded = [load(p) for p in joined["sets"]]
        decisions = list(joined["decision"])
        if not loaded and not decisions:
            return  # an empty pane: a streaming runner's closing pane (Beam's EMIT_ALWAYS), nothing to release
        if len(decisions) != 1:
            raise RuntimeError(f"sub-crowd has {len(decisions)} threshold decisions, expected exactly 1")
        yield from self.release(crowd_key, subkey, loaded, decisions[0])

    def release(self, crowd_key: CrowdKey, subkey: int, loaded: list[Any], decision: int) -> Iterator[ReleasePart]:
        """Every set of one sub-crowd (packed groups, or lists of units) and its decision -> its ReleasePart."""
        spec_id, crowd, window_end = crowd_key
        units = PackedUnits.concat([p if isinstance(p, PackedUnits) else PackedUnits.of(sorted(p)) for p in loaded])
        del loaded
        total_sets = int(units.n_sets.sum())
        if decision == WITHHELD:
            self._deleted.inc(total_sets)
            # An empty part says "this window closed and released nothing": the driver records it in the
            # ledger, so later reports for the window are late instead of forming a new crowd.
            yield ReleasePart(spec_id, crowd, window_end, subkey, (), 0, None, total_sets)
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
                          decision if published else None, total_sets)

