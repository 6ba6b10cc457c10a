"""The streaming shuffle's joins held in keyed state: a sub-crowd's sets with its threshold decision, and a
crowd's staged parts with its end offsets, each completed by *count*, not by a pane.

Why not a ``CoGroupByKey``: its two inputs arrive over paths of different length (the sets straight from the
dedupe, the decision after two more group-by-keys), and a join by pane is right only if every runner puts both
into the same pane. On Beam 2.62's Flink 1.19 runner they met in different panes at a drain ("sub-crowd has 0
threshold decisions, expected exactly 1"), the step failed, and the job restarted from its checkpoint in a
loop. Here each input is kept in the state of its key (and window) as it arrives, whatever its pane; the sub-crowd
is released the moment its decision is there *and* the sets it counted are all there, and a flag in the same
state makes it once: Flink snapshots the state with the outputs, so a restart neither repeats nor loses it.
The crowd's marker is written (last) once all of its parts are staged, the number of parts being in every
decision (``transforms.shuffler.threshold.Decision``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BooleanCoder, PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec

from transforms.shuffler.elements import NAMESPACE
from transforms.shuffler.spill import count_of, load
from transforms.shuffler.threshold import Decision, ReleaseFn, ReleasePart
from transforms.spec import AnalysisSpec

LOG = logging.getLogger(__name__)
SETS, DECISION = "s", "d"


_UNITS = BagStateSpec("units", PickleCoder())
_COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
_DECIDED = ReadModifyWriteStateSpec("decision", PickleCoder())
_RELEASED = ReadModifyWriteStateSpec("released", BooleanCoder())
_UNITS_P, _COUNT_P = beam.DoFn.StateParam(_UNITS), beam.DoFn.StateParam(_COUNT)
_DECIDED_P, _RELEASED_P = beam.DoFn.StateParam(_DECIDED), beam.DoFn.StateParam(_RELEASED)


class ReleaseInStateFn(beam.DoFn):
    """((crowd key, sub-key), (SETS, packed units) | (DECISION, Decision)) -> the sub-crowd's ReleasePart, once,
    as soon as the decision and every set it counted are in this key's state."""

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes):
        self._release = ReleaseFn(specs, key)
        self._after = Metrics.counter(NAMESPACE, "join_inputs_after_release")

    def process(self, element: tuple[tuple[Any, int], tuple[str, Any]],
                units: Any = _UNITS_P, count: Any = _COUNT_P, decided: Any = _DECIDED_P, done: Any = _RELEASED_P
                ) -> Iterator[ReleasePart]:
        (crowd_key, subkey), (tag, value) = element
        if done.read():
            # Nothing may follow a release: its sets were all counted. Kept out of the release, said loudly.
            self._after.inc()
            LOG.error("sub-crowd %s/%d: a %s after its release, ignored", crowd_key, subkey, tag)
            return
        if tag == DECISION:
            if decided.read() is not None:
                raise RuntimeError(f"sub-crowd {crowd_key}/{subkey} has two threshold decisions")
            decided.write(value)
        else:
            units.add(value)
            count.write((count.read() or 0) + count_of(value))
        decision: Decision | None = decided.read()
        have = count.read() or 0
        if decision is None or have < decision.n_units:
            return
        if have > decision.n_units:
            raise RuntimeError(f"sub-crowd {crowd_key}/{subkey} has {have} units, its decision counted "
                               f"{decision.n_units}")
        loaded = [load(v) for v in units.read()]
        done.write(True)
        units.clear()
        yield from self._release.release(crowd_key, subkey, loaded, decision.deletions)


class ReleaseInState(beam.PTransform):
    """(stripped sets keyed by (crowd, sub-key), their ``Decision``s) -> ReleaseParts (``ReleaseInStateFn``)."""

    def __init__(self, specs: Iterable[AnalysisSpec], key: bytes):
        super().__init__()
        self._specs, self._key = list(specs), key

    def expand(self, inputs: tuple[beam.PCollection, beam.PCollection]) -> beam.PCollection:
        sets, decisions = inputs
        return ((sets | "TagSets" >> beam.Map(tagged, SETS),
                 decisions | "TagDecisions" >> beam.Map(tagged, DECISION))
                | "SetsAndDecisions" >> beam.Flatten()
                | "Release" >> beam.ParDo(ReleaseInStateFn(self._specs, self._key)))


def tagged(keyed: tuple[Any, Any], tag: str) -> tuple[Any, tuple[str, Any]]:
    return keyed[0], (tag, keyed[1])


STAGED_PART, PARTS, END = "p", "n", "e"


_STAGED = BagStateSpec("parts", VarIntCoder())
_EXPECTED = ReadModifyWriteStateSpec("expected", VarIntCoder())
_ENDS = BagStateSpec("ends", PickleCoder())
_MARKED = ReadModifyWriteStateSpec("marked", BooleanCoder())
_STAGED_P, _EXPECTED_P = beam.DoFn.StateParam(_STAGED), beam.DoFn.StateParam(_EXPECTED)
_ENDS_P, _MARKED_P = beam.DoFn.StateParam(_ENDS), beam.DoFn.StateParam(_MARKED)


class MarkInStateFn(beam.DoFn):
    """(crowd, (PART, sub-key) | (PARTS, number of parts) | (END, (partition, end offset))) -> ``write(crowd,
    sub-keys, ends)`` once, when every part of the crowd is staged. A crowd whose every set was dead-lettered has
    no decision, hence no part count: nothing is written for it (as in bounded runs)."""

    def __init__(self, write: Callable[[Any, tuple[int, ...], dict[str, int]], None]):
        self._write = write
        self._after = Metrics.counter(NAMESPACE, "join_inputs_after_release")

    def setup(self) -> None:
        getattr(self._write, "setup", lambda: None)()

    def process(self, element: tuple[Any, tuple[str, Any]], staged: Any = _STAGED_P, expected: Any = _EXPECTED_P,
                ends: Any = _ENDS_P, done: Any = _MARKED_P) -> Iterator[None]:
        crowd, (tag, value) = element
        if done.read():
            if tag != PARTS:  # every decision says the part count: those after the marker are expected
                self._after.inc()
                LOG.error("crowd %s: a %s after its marker, ignored", crowd, tag)
            return iter(())
        if tag == STAGED_PART:
            staged.add(value)
        elif tag == PARTS:
            expected.write(value)
        else:
            ends.add(value)
        n = expected.read()
        subkeys = tuple(sorted(set(staged.read())))
        if n is None or len(subkeys) < n:
            return iter(())
        last: dict[str, int] = {}
        for pkey, end in ends.read():
            last[pkey] = max(last.get(pkey, 0), end)
        self._write(crowd, subkeys, last)
        done.write(True)
        staged.clear()
        ends.clear()
        return iter(())
