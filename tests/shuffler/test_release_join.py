"""The streaming shuffle's joins in keyed state (``transforms.shuffler.release_join``) on Beam's streaming direct
runner, fed by a ``TestStream`` that puts the two sides of a join in different panes -- what Flink 1.19 did at a
drain. The join by pane (``CoGroupByKey`` + ``ReleaseFn``) fails on it ("0 threshold decisions", the job's
restart loop on the cluster); the join in state releases the sub-crowd once, byte for byte what the pane join
releases when both sides meet, and the marker waits for every part of its crowd."""

from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Duration

from tests.transforms.release_inputs import KEY, WIN_A, WINDOW_MS, make_spec
from transforms.shuffler.packed import PackedUnits
from transforms.shuffler.release_join import END, PARTS, STAGED_PART, MarkInStateFn, ReleaseInState, tagged
from transforms.shuffler.streaming import CROWD_WINDOW_MS, crowd_window
from transforms.shuffler.threshold import Decision, ReleaseFn

SPEC = make_spec(subkeys=2)
CROWD = (SPEC.spec_id, None, WIN_A + WINDOW_MS)
AT = crowd_window(SPEC, CROWD[2]).start  # the crowd window's only instant: every element of the crowd is there
DECISION = Decision(deletions=2, n_units=5, n_parts=2)


def _units(first: int, n: int) -> PackedUnits:
    units = [(1, ((i % 3, f"payload-{i}".encode()),)) for i in range(first, first + n)]
    return PackedUnits.of(units, ranks=list(range(first, first + n)))


SETS = [_units(0, 3), _units(3, 2)]  # one sub-crowd's stripped units, from two dedupe buckets


def _windowed(stream: TestStream, pipeline: beam.Pipeline) -> beam.PCollection:
    """The gate's windowing: a 1 ms crowd window, on time at the watermark, then a pane per late element."""
    return (pipeline | stream
            | beam.WindowInto(window.FixedWindows(Duration(micros=CROWD_WINDOW_MS * 1000)),
                              trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                              accumulation_mode=trigger.AccumulationMode.DISCARDING,
                              allowed_lateness=Duration(seconds=86_400)))


def _split_panes() -> TestStream:
    """Both set groups on time; the decision only after the watermark passed the window: a LATE pane."""
    return (TestStream()
            .advance_watermark_to(AT - 1)
            .add_elements([window.TimestampedValue(("s", s), AT) for s in SETS])
            .advance_watermark_to(AT + 10)
            .add_elements([window.TimestampedValue(("d", DECISION), AT)])
            .advance_watermark_to_infinity())


class _Append(beam.DoFn):
    def __init__(self, path: str):
        self._path = path

    def process(self, element: object) -> None:
        with open(self._path, "ab") as out:
            pickle.dump(element, out)


def _loaded(path: Path) -> list:
    found = []
    with path.open("rb") as source:
        while True:
            try:
                found.append(pickle.load(source))
            except EOFError:
                return found


def _run(build) -> None:
    options = PipelineOptions([])
    options.view_as(StandardOptions).streaming = True
    with beam.Pipeline(runner=BundleBasedDirectRunner(), options=options) as pipeline:
        build(pipeline)


def _sides(tagged_values: beam.PCollection, decision) -> tuple[beam.PCollection, beam.PCollection]:
    sets = tagged_values | "Sets" >> beam.FlatMap(lambda tv: [((CROWD, 0), tv[1])] if tv[0] == "s" else [])
    decisions = tagged_values | "Decisions" >> beam.FlatMap(
        lambda tv: [((CROWD, 0), decision(tv[1]))] if tv[0] == "d" else [])
    return sets, decisions


def test_the_join_by_pane_fails_when_the_decision_comes_in_a_later_pane() -> None:
    def build(pipeline: beam.Pipeline) -> None:
        sets, decisions = _sides(_windowed(_split_panes(), pipeline), lambda d: d.deletions)
        _ = ({"sets": sets, "decision": decisions} | beam.CoGroupByKey()
             | beam.ParDo(ReleaseFn([SPEC], KEY)))

    with pytest.raises(Exception, match="0 threshold decisions"):
        _run(build)


def test_the_join_in_state_releases_the_sub_crowd_once_whatever_the_panes(tmp_path: Path) -> None:
    out = tmp_path / "parts.pkl"

    def build(pipeline: beam.Pipeline) -> None:
        sets, decisions = _sides(_windowed(_split_panes(), pipeline), lambda d: d)
        _ = (sets, decisions) | ReleaseInState([SPEC], KEY) | beam.ParDo(_Append(str(out)))

    _run(build)
    _same_as_the_pane_join(_loaded(out))


def _same_as_the_pane_join(parts: list) -> None:
    """One part, equal to what ``ReleaseFn`` releases when sets and decision meet in one pane."""
    expected = list(ReleaseFn([SPEC], KEY).process(((CROWD, 0), {"sets": list(SETS), "decision": [2]})))
    assert len(parts) == 1 and len(expected) == 1
    got, want = parts[0], expected[0]
    assert got._replace(messages=None) == want._replace(messages=None)
    assert list(got.messages) == list(want.messages) and got.n_sets == 3  # 5 units, 2 deleted


def test_the_join_in_state_waits_for_every_set_the_decision_counted(tmp_path: Path) -> None:
    """The decision first, then the sets in two panes, the second late: one release, after the last set."""
    out = tmp_path / "parts.pkl"
    stream = (TestStream()
              .advance_watermark_to(AT - 1)
              .add_elements([window.TimestampedValue(("d", DECISION), AT),
                             window.TimestampedValue(("s", SETS[0]), AT)])
              .advance_watermark_to(AT + 10)
              .add_elements([window.TimestampedValue(("s", SETS[1]), AT)])
              .advance_watermark_to_infinity())

    def build(pipeline: beam.Pipeline) -> None:
        sets, decisions = _sides(_windowed(stream, pipeline), lambda d: d)
        _ = (sets, decisions) | ReleaseInState([SPEC], KEY) | beam.ParDo(_Append(str(out)))

    _run(build)
    _same_as_the_pane_join(_loaded(out))


class _Markers:
    """A ``write`` for ``MarkInStateFn`` that appends what it is given to a file."""
    def __init__(self, path: str):
        self._path = path

    def __call__(self, crowd, subkeys, ends) -> None:
        with open(self._path, "ab") as out:
            pickle.dump((crowd, subkeys, ends), out)


def test_the_marker_waits_for_every_part_of_its_crowd(tmp_path: Path) -> None:
    out = tmp_path / "markers.pkl"
    stream = (TestStream()
              .advance_watermark_to(AT - 1)
              .add_elements([window.TimestampedValue(e, AT) for e in [
                  (END, ("reports/0", 17)), (END, ("reports/1", 9)), (PARTS, 2), (STAGED_PART, 1),
                  (END, ("reports/0", 12))]])
              .advance_watermark_to(AT + 10)
              .add_elements([window.TimestampedValue((PARTS, 2), AT), window.TimestampedValue((STAGED_PART, 0), AT)])
              .advance_watermark_to_infinity())

    def build(pipeline: beam.Pipeline) -> None:
        _ = (_windowed(stream, pipeline) | beam.Map(lambda tv: (CROWD, tv))
             | beam.Map(lambda kv: tagged((kv[0], kv[1][1]), kv[1][0]))
             | beam.ParDo(MarkInStateFn(_Markers(str(out)))))

    _run(build)
    assert _loaded(out) == [(CROWD, (0, 1), {"reports/0": 17, "reports/1": 9})]
