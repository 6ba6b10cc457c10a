"""The shuffler's streaming stages: event-time windows in the runner, late panes dead-lettered, releases
staged with a completion marker for the driver's release agent.

The bounded jobs decide which windows are closed themselves (``transforms.shuffler.graph.WindowClock``). A streaming
pipeline leaves it to the runner: every authenticated set is re-timestamped to the last millisecond before
*window end + allowed lateness* of its crowd and put in Beam's standard ``FixedWindows`` of one millisecond
(``crowd_window``): the window ``[end + lateness - 1 ms, end + lateness)``, whose on-time pane fires once the
watermark passes *window end + allowed lateness*, exactly when the bounded ``WindowClock`` closes it. Only a
standard WindowFn: a runner that does its windowing in Java (Flink, Dataflow) refuses a pickled Python one
("Unknown or unsupported WindowFn: beam:window_fn:pickled_python:v1"); specs of any window size and lateness
share the one WindowFn, and crowds that end together share a Beam window but never a key. Beam's own allowed
lateness is then used for something else: how long after that the runner still keeps a window's (tiny,
DISCARDING) trigger state so that later sets come out as a LATE pane and are dead-lettered as late
(``LateGateFn``) instead of being dropped silently. It is the ingress's ``max_age`` (older sets are refused at
ingress anyway).

After the gate the unchanged ``transforms.shuffler.graph.Shuffle`` runs with a clock that treats every window it
sees as closed (``drain``) and without event times, hence without a side input (an empty side input in the
global window can stay unready on a streaming runner and hold every window): only on-time panes reach it, one
per window. Its parts are staged one file per
part under ``releases/<release id>/``; when all parts of a release are staged (one on-time pane, grouped per
crowd) a marker ``done-*.pkl`` is written, last, with the part list and, per partition, the end offset of
the window's records (the ledger's ``source_ends``: a re-read below it is a re-read, above it is late).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms import window
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import Timestamp

from transforms.io.dead_letters import dead_letter
from transforms.io.kafka.clients import KafkaRecord
from transforms.io.kafka.unbounded import wall_ms
from transforms.io.staging import StageFn, StagingDoFn, is_url, join, stable_name, write_batch
from transforms.shuffler.elements import DEAD, NAMESPACE, TIMES, VERIFIED, SetElement, TimePolicy
from transforms.shuffler.graph import ReleasePart, Shuffle, WindowClock, part_header
from transforms.shuffler.ingress import IngressFn, shared_registry
from transforms.shuffler.release_join import END, PARTS, STAGED_PART, MarkInStateFn, tagged
from transforms.spec import AnalysisSpec
from transforms.state.prior_runs import PriorRuns
from transforms.trust.envelope import open_envelopes
from transforms.trust.keys import load_shuffler_sealing_private
from transforms.trust.message_set import AuthError, decode_message_set, verify_message_set
from transforms.trust.release import release_id_of

LOG = logging.getLogger(__name__)
ENDS = "source_ends"
RELEASES, DEAD_DIR, STOP_FILE = "releases", "dead", "STOP"
MARKER, PART = "done", "part"
LATE_REASON = "late: its window was already released"


def _ms(timestamp_ms: int) -> Timestamp:
    return Timestamp(micros=timestamp_ms * 1000)


@dataclass(frozen=True)
class WallClockTimePolicy(TimePolicy):
    """Ingress's event-time bounds against the wall clock of each check, not a run's start: a streaming
    pipeline runs for months (``now_ms`` is only the clock at start, kept for the error messages)."""
    def problem(self, event_time_ms: int, now_ms: int | None = None) -> str | None:
        return super().problem(event_time_ms, wall_ms() if now_ms is None else now_ms)


class RegistryWatch:
    """Whether the enrolment registry file changed since last asked (looked at every ``every_s`` seconds):
    a pipeline that runs for months must see devices enrolled after it started."""
    def __init__(self, path: str, every_s: float = 30.0):
        self._path, self._every_s = path, every_s
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0

    def changed(self) -> bool:
        now = time.monotonic()
        if now - self._checked < self._every_s:
            return False
        self._checked = now
        try:
            stat = os.stat(self._path)
        except OSError:
            return False
        stamp, previous = (stat.st_mtime_ns, stat.st_size), self._stamp
        self._stamp = stamp
        return previous is not None and stamp != previous

    def start(self) -> None:
        self._checked = 0.0
        self.changed()


class StreamingIngressFn(IngressFn):
    """``IngressFn`` as it is, reloading the device registry (through its own ``setup``) when the file changes."""
    def __init__(self, specs: Sequence[AnalysisSpec], registry_path: str, *args: Any, **kwargs: Any):
        super().__init__(specs, registry_path, *args, **kwargs)
        self._watch = RegistryWatch(registry_path)

    def setup(self) -> None:
        super().setup()
        self._watch.start()

    def process(self, element: Any) -> Iterator[Any]:
        if self._watch.changed():
            LOG.info("device registry changed: reloading it")
            super().setup()
        return super().process(element)


class SetEventTimes:
    """The watermark policy of the shuffler's source: the largest event time of a polled chunk that belongs
    to an *authenticated* set within ingress's time bounds.

    A forged far-future event time would otherwise move the watermark and close windows early. Only a
    sample (the chunk's last ``sample`` records, where a time-ordered stream has its latest times) is
    decoded, and only the best ``tries`` candidates have their signature verified: a few verifications per
    chunk instead of one per record. A sample can only under-estimate the maximum, which delays windows,
    never closes one early.
    """
    def __init__(self, specs: Sequence[AnalysisSpec], registry_path: str, max_age_ms: int, max_skew_ms: int,
                 sample: int = 256, tries: int = 4, *, keys_dir: str):
        self._keys_dir = keys_dir  # the shuffler's sealing keys: every set arrives sealed to them
        self._sealing: Any = None
        self._spec_ids = frozenset(s.spec_id for s in specs)
        self._registry_path, self._max_age_ms, self._max_skew_ms = registry_path, max_age_ms, max_skew_ms
        self._sample, self._tries = sample, tries
        self._registry: Any = None
        self._watch = RegistryWatch(registry_path)

    def setup(self) -> None:
        import schemas  # noqa: F401  (schemas must import before trust's decoders)

        self._registry = shared_registry(self._registry_path)  # the device store, or a legacy Parquet file
        self._sealing = load_shuffler_sealing_private(self._keys_dir)
        self._watch.start()

    def max_event_ms(self, records: Sequence[KafkaRecord]) -> int | None:
        """The largest authenticated event time of the sample, never later than the wall clock: a device whose
        clock runs fast (or lies) must not move the watermark past what has actually happened."""
        if self._watch.changed():
            self.setup()

        now = wall_ms()
        candidates = []
        sample = [r.value for r in records[-self._sample:] if r.value is not None]
        for value in open_envelopes(self._sealing, sample):
            if not isinstance(value, bytes):
                continue  # an envelope that does not open is ingress's to dead-letter, not a time to believe
            try:
                message_set = decode_message_set(value)
            except Exception:  # nor is anything undecodable
                continue
            t = message_set.event_time_ms
            if message_set.spec_id in self._spec_ids and now - self._max_age_ms <= t <= now + self._max_skew_ms:
                candidates.append((t, message_set))
        candidates.sort(key=lambda c: -c[0])
        for t, message_set in candidates[:self._tries]:
            try:
                verify_message_set(message_set, self._registry)
            except AuthError:
                continue
            return min(t, now)
        return None


CROWD_WINDOW_MS = 1  # the standard FixedWindows every crowd's sets are put in (see the module doc)


def crowd_window(spec: AnalysisSpec, window_end_ms: int) -> IntervalWindow:
    """The Beam window of a crowd of the spec's window ending at ``window_end_ms``: it ends at end + lateness."""
    fires_ms = window_end_ms + spec.allowed_lateness_seconds * 1000
    return IntervalWindow(_ms(fires_ms - CROWD_WINDOW_MS), _ms(fires_ms))


class AtCrowdWindowFn(beam.DoFn):
    """Each ingress group ``((spec, crowd, window_end, bucket), sets)`` re-timestamped into its crowd window
    (``crowd_window``), from the key, not the element's old timestamp."""
    def __init__(self, specs: Iterable[AnalysisSpec]):
        self._specs = {s.spec_id: s for s in specs}

    def process(self, element: tuple[tuple[str, str | None, int, int], Any]) -> Iterator[Any]:
        (spec_id, _, window_end, _), _ = element
        yield window.TimestampedValue(element, crowd_window(self._specs[spec_id], window_end).start)


class LateGateFn(beam.DoFn):
    """A crowd window's grouped sets: an on-time pane goes on to the shuffle (and says where the window's
    records end, per partition); a LATE pane -- sets for a window the runner already fired -- is dead-lettered,
    set by set, and never released."""
    def __init__(self) -> None:
        self._late = Metrics.counter(NAMESPACE, "sets_late")
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")

    def process(self, keyed: tuple[tuple[str, str | None, int, int], Iterable[bytes]],
                pane: Any = beam.DoFn.PaneInfoParam) -> Iterator[Any]:
        key, blobs = keyed
        blobs = list(blobs)
        items: list[SetElement] = [item for blob in blobs for item in pickle.loads(blob)]
        if pane.timing == beam.utils.windowed_value.PaneInfoTiming.LATE:
            self._late.inc(len(items))
            self._dead.inc(len(items))
            for item in items:
                yield TaggedOutput(DEAD, dead_letter("shuffle", LATE_REASON, source=item.source,
                                                     spec_id=item.spec_id))
            return
        ends: dict[str, int] = {}
        for item in items:
            pkey = f"{item.source.topic}/{item.source.partition}"
            ends[pkey] = max(ends.get(pkey, 0), item.source.offset + 1)
        crowd = key[:3]
        for pkey, end in ends.items():
            yield TaggedOutput(ENDS, (crowd, (pkey, end)))
        for blob in blobs:
            yield key, blob


class GateWindows(beam.PTransform):
    """Ingress groups -> their crowd windows, grouped, gated: (on-time groups, ENDS, DEAD) of ``LateGateFn``.

    ``late_for_seconds``: how long after a window fired the runner keeps its trigger state, so later sets are
    dead-lettered as late rather than dropped silently (the ingress's ``max_age``).
    """
    def __init__(self, specs: Iterable[AnalysisSpec], late_for_seconds: int):
        super().__init__()
        self._specs, self._late_for = list(specs), late_for_seconds

    def expand(self, sets: beam.PCollection) -> Any:
        from apache_beam.transforms import trigger
        from apache_beam.utils.timestamp import Duration

        return (sets
                | "AtCrowdWindow" >> beam.ParDo(AtCrowdWindowFn(self._specs))
                | "CrowdWindows" >> beam.WindowInto(
                    window.FixedWindows(Duration(micros=CROWD_WINDOW_MS * 1000)),
                    trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                    accumulation_mode=trigger.AccumulationMode.DISCARDING,
                    allowed_lateness=Duration(seconds=self._late_for))
                | "GroupWindow" >> beam.GroupByKey()
                | "LateGate" >> beam.ParDo(LateGateFn()).with_outputs(DEAD, ENDS, main="on_time"))


def release_dir(root: str, part: ReleasePart | tuple[str, str | None, int]) -> str:

    spec_id, crowd, end = (part.spec_id, part.crowd_id, part.window_end_ms) if isinstance(part, ReleasePart) else part
    return join(root, RELEASES, release_id_of(spec_id, crowd, end))


def _stage(directory: str, prefix: str, named: list[tuple[str, bytes]], headers: dict[str, Any] | None = None) -> None:
    if not is_url(directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
    write_batch(directory, prefix, named, headers)


class StagePartFn(StagingDoFn):
    """Stage one release part in its own file now (not at the end of the bundle) and say so downstream:
    the token leaves only after the file is written, so the marker that follows them is written last."""
    def process(self, part: ReleasePart) -> Iterator[tuple[tuple[str, str | None, int], int]]:
        name = f"{part.subkey:05d}"  # the header lets the release agent read the part's messages once
        _stage(release_dir(self._directory, part), PART, [(name, pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))],
               {name: part_header(part)})
        yield (part.spec_id, part.crowd_id, part.window_end_ms), part.subkey


class StagedRelease(NamedTuple):
    """The marker of a staged release: its crowd, the sub-keys of its parts, its records' end offsets."""
    crowd: tuple[str, str | None, int]
    subkeys: tuple[int, ...]
    source_ends: dict[str, int]


class MarkReleaseFn(StagingDoFn):
    """(crowd, {"parts": sub-keys, "ends": (partition, end)}) -> the release's marker, written last: a join by
    pane (kept for its callers); the streaming graph joins in keyed state instead (``WriteMarker``)."""
    def __init__(self, directory: str):
        super().__init__(directory)
        self._write = WriteMarker(directory)

    def process(self, keyed: tuple[tuple[str, str | None, int], dict[str, Iterable[Any]]]) -> Iterator[None]:
        crowd, joined = keyed
        subkeys = tuple(sorted(set(joined["parts"])))
        if not subkeys:
            return iter(())  # every set of the window was dead-lettered: nothing to release (as in bounded runs)
        ends: dict[str, int] = {}
        for pkey, end in joined["ends"]:
            ends[pkey] = max(ends.get(pkey, 0), end)
        self._write(crowd, subkeys, ends)
        return iter(())


class WriteMarker(StagingDoFn):
    """Stage a release's marker (``StagedRelease``) under ``root`` (called by ``release_join.MarkInStateFn``,
    which calls its ``setup``: the filesystem options of an object store)."""
    def __init__(self, root: str):
        super().__init__(root)
        self._root = root
        self._staged = Metrics.counter(NAMESPACE, "releases_staged")

    def __call__(self, crowd: tuple[str, str | None, int], subkeys: tuple[int, ...], ends: dict[str, int]) -> None:
        _stage(release_dir(self._root, crowd), MARKER, [(MARKER, pickle.dumps(StagedRelease(crowd, subkeys, ends)))])
        self._staged.inc()


def letter_name(letter: dict[str, Any]) -> str:
    """A dead letter's staging name: its position and reason (unique per letter, stable across retries)."""
    return stable_name(letter.get("topic"), letter.get("partition"), letter.get("offset"), letter.get("stage"),
                       hashlib.sha256(repr(sorted(letter.items())).encode()).hexdigest()[:16])


class StreamShuffle(beam.PTransform):
    """Batches of Kafka records (from the unbounded source) -> staged releases, markers and dead letters: the
    whole streaming shuffle after its source (see the module doc). ``times`` is ingress's event-time policy
    (``WallClockTimePolicy`` in a job); ``key`` the shuffler's PRF key; ``root`` the staging location.
    ``join_in_state``: the sub-crowds' and the markers' joins in keyed state (``release_join``; what the driver
    asks for on Flink), else by pane (``CoGroupByKey``)."""
    def __init__(self, specs: Sequence[AnalysisSpec], registry: str, prior: PriorRuns, times: TimePolicy, key: bytes,
                 root: str, late_for_seconds: int, crypto_threads: int = 0, python_gc: str = "tuned", *,
                 keys_dir: str, join_in_state: bool = False):
        super().__init__()
        self._keys_dir, self._in_state = keys_dir, join_in_state
        self._specs, self._registry, self._prior, self._times = list(specs), registry, prior, times
        self._key, self._root, self._late_for, self._threads = key, root, late_for_seconds, crypto_threads
        self._python_gc = python_gc

    def expand(self, records: beam.PCollection) -> beam.pvalue.PDone:
        specs, pipeline = self._specs, records.pipeline
        ingress = (records
                   | "Ingress" >> beam.ParDo(StreamingIngressFn(specs, self._registry, self._prior, self._times,
                                                                self._threads, keys_dir=self._keys_dir,
                                                                python_gc=self._python_gc))
                   .with_outputs(DEAD, TIMES, VERIFIED, main="sets"))
        gated = ingress.sets | "Windows" >> GateWindows(specs, self._late_for)
        # The runner closed the window: the shuffle's own clock must not hold anything back, nor wait for times.
        clock = WindowClock(self._times.now_ms, 0, 0, drain=True)
        shuffle = Shuffle(specs, self._key, clock, {s.spec_id: s.crowd.subkeys for s in specs},
                          join_in_state=self._in_state)
        released, _, shuffle_dead, _ = gated.on_time | "Shuffle" >> shuffle
        tokens = released | "StageParts" >> beam.ParDo(StagePartFn(self._root))
        if self._in_state:  # joined in keyed state, not by pane (transforms.shuffler.release_join)
            _ = ((tokens | "TagParts" >> beam.Map(tagged, STAGED_PART),
                  shuffle.part_counts | "TagCounts" >> beam.Map(tagged, PARTS),
                  gated[ENDS] | "TagEnds" >> beam.Map(tagged, END))
                 | "PartsAndEnds" >> beam.Flatten()
                 | "MarkReleases" >> beam.ParDo(MarkInStateFn(WriteMarker(self._root))))
        else:
            _ = ({"parts": tokens, "ends": gated[ENDS]} | "JoinEnds" >> beam.CoGroupByKey()
                 | "MarkReleases" >> beam.ParDo(MarkReleaseFn(self._root)))
        letters = [pcoll | f"Unwindow{i}" >> beam.WindowInto(window.GlobalWindows())
                   for i, pcoll in enumerate((ingress[DEAD], gated[DEAD], shuffle_dead))]
        _ = (letters | "AllDead" >> beam.Flatten()
             | "StageDeadLetters" >> beam.ParDo(StageFn(join(self._root, DEAD_DIR), "dead", letter_name)))
        return beam.pvalue.PDone(pipeline)
