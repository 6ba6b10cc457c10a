"""The streaming shuffler's windows on runners that really stream, with a TestStream (Beam's Python direct
runner, and Prism, Beam's portable Go runner, with its workers in this process): a crowd window fires once,
when the watermark passes its end plus the spec's allowed lateness, and sets that arrive after that come out
as a late pane and are dead-lettered, never passed on."""

from __future__ import annotations

import pickle

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from tests.transforms.streaming_runners import STREAMING_RUNNERS, streaming_runner
from transforms.shuffler.elements import DEAD, SetElement
from transforms.shuffler.streaming import ENDS, LATE_REASON, AtCrowdWindowFn, GateWindows, crowd_window
from transforms.spec import spec_from_dict
from transforms.wire.elements import SourceRef

SIZE_S, LATENESS_S = 600, 120
SPEC = spec_from_dict({
    "analysis": {"name": "gate", "metric": "gate"}, "domain": {"size": 4},
    "mechanism": {"name": "grr", "epsilon": 2.0},
    "window": {"size_seconds": SIZE_S, "allowed_lateness_seconds": LATENESS_S},
}, source="test_stream_windows")
END = 1_800_000_000_000 // (SIZE_S * 1000) * SIZE_S * 1000
COLLECTED: dict[str, list] = {}


def _group(devices: list[str], offset: int) -> tuple[tuple, bytes]:
    """One ingress output: ((spec, crowd, window end, bucket), pickled sets), as ``IngressFn`` emits it."""
    sets = [SetElement(SPEC.spec_id, None, d, END - 1000, END, bytes(32), ((0, b"x"),),
                       SourceRef("reports", 0, offset + i)) for i, d in enumerate(devices)]
    return (SPEC.spec_id, None, END, 0), pickle.dumps(sets)


class _Keep(beam.DoFn):
    """Collect elements in this process's module dict (the direct runner runs here; classes of an importable
    module are pickled by reference, so the dict is this one)."""

    def __init__(self, name: str):
        self._name = name

    def process(self, element) -> None:
        COLLECTED.setdefault(self._name, []).append(element)


@pytest.mark.parametrize("runner_name", STREAMING_RUNNERS)
def test_on_time_once_at_end_plus_lateness_then_late_sets_are_dead_lettered(runner_name: str) -> None:
    COLLECTED.clear()
    fire_at_s = (END + LATENESS_S * 1000) / 1000
    stream = (TestStream()
              .advance_watermark_to(END / 1000 - 300)
              .add_elements([TimestampedValue(_group(["a", "b"], 0), END / 1000 - 200)])
              .advance_watermark_to(END / 1000 + 60)  # past the window's end, within its lateness: still open
              .add_elements([TimestampedValue(_group(["c"], 2), END / 1000 + 61)])
              .advance_watermark_to(fire_at_s + 1)  # the window fires: a, b, c
              .add_elements([TimestampedValue(_group(["d", "e"], 3), fire_at_s + 2)])  # late
              .advance_watermark_to_infinity())
    runner, options = streaming_runner(runner_name)
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        gated = pipeline | stream | GateWindows([SPEC], late_for_seconds=86_400)
        _ = gated.on_time | "OnTime" >> beam.ParDo(_Keep("on_time"))
        _ = gated[ENDS] | "Ends" >> beam.ParDo(_Keep("ends"))
        _ = gated[DEAD] | "Dead" >> beam.ParDo(_Keep("dead"))
    on_time = [s.device_id for _, blob in COLLECTED["on_time"] for s in pickle.loads(blob)]
    assert sorted(on_time) == ["a", "b", "c"]  # one pane, with what arrived before end + lateness
    assert COLLECTED["ends"] == [((SPEC.spec_id, None, END), ("reports/0", 3))]
    dead = COLLECTED["dead"]
    assert sorted(d["offset"] for d in dead) == [3, 4]
    assert {d["reason"] for d in dead} == {LATE_REASON} and {d["stage"] for d in dead} == {"shuffle"}


def test_crowd_window_ends_at_the_spec_window_end_plus_its_lateness() -> None:
    from apache_beam.transforms.window import FixedWindows, WindowFn
    from apache_beam.utils.timestamp import Duration

    (stamped,) = AtCrowdWindowFn([SPEC]).process(_group(["a"], 0))
    (assigned,) = FixedWindows(Duration(micros=1000)).assign(WindowFn.AssignContext(stamped.timestamp))
    assert assigned == crowd_window(SPEC, END)
    assert assigned.end.micros // 1000 == END + LATENESS_S * 1000  # fires when the bounded WindowClock closes it
    assert assigned.start.micros // 1000 == END + LATENESS_S * 1000 - 1


def test_the_streaming_graph_uses_only_standard_window_fns_and_no_side_input(tmp_path) -> None:
    """What a runner that windows in Java (Flink, Dataflow) accepts: no ``pickled_python`` WindowFn, and no side
    input (an empty one in the global window can stay unready on a streaming runner and hold every window)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    from tests.transforms.release_inputs import KEY, TIMES_POLICY
    from transforms.shuffler.streaming import StreamShuffle
    from transforms.state.prior_runs import PriorRuns

    options = PipelineOptions([])
    options.view_as(StandardOptions).streaming = True
    pipeline = beam.Pipeline(options=options)
    _ = (pipeline | beam.Create([]).with_output_types(bytes)
         | StreamShuffle([SPEC], str(tmp_path / "registry"), PriorRuns(), TIMES_POLICY, KEY, str(tmp_path), 86_400,
                         keys_dir=str(tmp_path)))
    proto = pipeline.to_runner_api()
    urns = {s.window_fn.urn for s in proto.components.windowing_strategies.values()}
    assert urns <= {"beam:window_fn:global_windows:v1", "beam:window_fn:fixed_windows:v1"}, urns
    side_inputs = [t.unique_name for t in proto.components.transforms.values()
                   if t.spec.urn == "beam:transform:pardo:v1" and _pardo(t).side_inputs]
    assert side_inputs == []


def _pardo(transform):
    from apache_beam.portability.api import beam_runner_api_pb2

    return beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
