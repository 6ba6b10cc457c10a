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

The steps live in ``transforms.shuffler.plan`` (scale-out, window clock), ``transforms.shuffler.dedupe`` (hold,
dedupe, strip) and ``transforms.shuffler.threshold`` (threshold, delete and permute); their public names are
importable from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.pvalue import AsDict

from transforms.io.staging import Location
from transforms.shuffler.dedupe import HELD, DedupeAndStripFn, Unit, set_problem
from transforms.shuffler.elements import DEAD
from transforms.shuffler.packed import Message
from transforms.shuffler.plan import (
    MAX_BUCKETS,
    MAX_SUBKEYS,
    RECORDS_PER_BUCKET,
    RECORDS_PER_SUBKEY,
    ScaleOut,
    WindowClock,
)
from transforms.shuffler.spill import count_of
from transforms.shuffler.threshold import (
    WITHHELD,
    CrowdKey,
    CrowdThresholdFn,
    PartHeader,
    ReleaseFn,
    ReleasePart,
    discrete_laplace,
    noisy_crowd_target,
    part_header,
)
from transforms.spec import AnalysisSpec

__all__ = ["HELD", "MAX_BUCKETS", "MAX_SUBKEYS", "RECORDS_PER_BUCKET", "RECORDS_PER_SUBKEY", "WITHHELD", "CrowdKey",
           "CrowdThresholdFn", "DedupeAndStripFn", "Message", "PartHeader", "ReleaseFn", "ReleasePart", "ScaleOut",
           "Shuffle", "Unit", "WindowClock", "discrete_laplace", "noisy_crowd_target", "part_header", "set_problem"]


class Shuffle(beam.PTransform):
    """Authenticated sets (from ``IngressFn``) + per-partition event times -> (ReleaseParts, held, dead, run times).

    Given the sets alone (no event times) with a drain clock (every window closed), the graph has no side input.

    ``held`` carries (partition key, earliest offset) of sets in windows that are still open. With ``spill``
    (a directory or URL every worker can write, e.g. under the run's staging location), the stripped units
    are spilled there and only references are grouped (``transforms.shuffler.spill``).
    """

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes, clock: WindowClock,
                 subkeys: Mapping[str, int] | None = None, *, spill: Location | None = None,
                 join_in_state: bool = False):
        super().__init__()
        self._specs, self._key, self._clock = list(specs), key, clock
        self._subkeys = dict(subkeys or {})
        self._spill = spill
        # A streaming graph joins each sub-crowd's sets and decision in keyed state, not by pane
        # (``transforms.shuffler.release_join``); then ``part_counts`` is (crowd, number of parts), one per part.
        self._in_state = join_in_state
        self.part_counts: beam.PCollection | None = None

    def expand(self, inputs: beam.PCollection | tuple[beam.PCollection, beam.PCollection]) -> tuple[Any, Any, Any, Any]:
        keyed_sets, times = (inputs, None) if isinstance(inputs, beam.PCollection) else inputs
        dedupe = DedupeAndStripFn(self._specs, self._key, self._clock, self._subkeys, self._spill)
        if times is None:
            # No event times: only a drain clock may close windows without them. A streaming graph, whose runner
            # closed the window already, passes its sets alone: no side input at all, so nothing can wait for one to be
            # ready (an empty side input in the global window can stay unready on a streaming runner).
            if not self._clock.drain:
                raise ValueError("a Shuffle without event times needs a drain clock")
            run_times = None
            args: tuple[Any, ...] = ()
        else:
            run_times = times | "MaxEventTime" >> beam.CombinePerKey(max)
            args = (AsDict(run_times),)
        deduped = (
            keyed_sets
            | "GroupByDeviceBucket" >> beam.GroupByKey()
            | "DedupeAndStrip" >> beam.ParDo(dedupe, *args).with_outputs(DEAD, HELD, main="kept")
        )
        stripped = deduped.kept | "BySubkey" >> beam.Map(lambda kv: ((kv[0], kv[1][0]), kv[1][1]))
        decisions = (
            stripped
            | "PartSizes" >> beam.Map(lambda kv: (kv[0], count_of(kv[1])))
            # A group-by-key and a sum, not CombinePerKey(sum): a streaming runner's closing pane (Beam's Python
            # SDK asks for EMIT_ALWAYS) would come out of a combiner as a sum of 0, a second size for the same
            # sub-crowd (measured on Flink 1.19 at a drain); out of a group-by-key it is an empty group, skipped.
            | "SubcrowdSizes" >> beam.GroupByKey()
            | "SumSizes" >> beam.FlatMap(_summed)
            | "KeyByCrowd" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupCrowd" >> beam.GroupByKey()
            | "Threshold" >> beam.ParDo(CrowdThresholdFn(self._specs, self._key, counted=self._in_state))
        )
        if self._in_state:
            from transforms.shuffler.release_join import ReleaseInState

            released = (stripped, decisions) | "DeleteAndPermute" >> ReleaseInState(self._specs, self._key)
            self.part_counts = decisions | "PartCounts" >> beam.Map(lambda kv: (kv[0][0], kv[1].n_parts))
        else:
            released = (
                {"sets": stripped, "decision": decisions}
                | "JoinDecisions" >> beam.CoGroupByKey()
                | "DeleteAndPermute" >> beam.ParDo(ReleaseFn(self._specs, self._key))
            )
        held = deduped[HELD] | "EarliestHeld" >> beam.CombinePerKey(min)
        return released, held, deduped[DEAD], run_times


def _summed(keyed: tuple[Any, Iterable[int]]) -> Iterable[tuple[Any, int]]:
    """(key, counts) -> (key, their sum); nothing for an empty pane."""
    key, counts = keyed
    counts = list(counts)
    return [(key, sum(counts))] if counts else []
