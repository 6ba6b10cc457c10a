"""A small harness for Beam stage tests: run a pipeline for real and look at everything it produced.

Each named output is captured with its timestamp and window (lists emitted by batched stages, and the encoder's
``ReportBatch`` arrays, are observed element by element), together with the ``esa`` counters summed over steps.
Batch runs use the FnApiRunner; ``streaming=True`` (TestStream) uses the BundleBasedDirectRunner, which works
offline.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import trigger, window

from pipelines.job import esa_counters
from transforms.encoder.encode import ReportBatch


class Observed(NamedTuple):
    value: Any
    timestamp_us: int
    window_start_us: int | None  # None: the global window
    window_end_us: int | None


class PipelineRun(NamedTuple):
    outputs: dict[str, list[Observed]]
    counters: dict[str, int]

    def values(self, name: str) -> list[Any]:
        return [o.value for o in self.outputs[name]]

    def count(self, name: str) -> int:
        return self.counters.get(name, 0)


class _Observe(beam.DoFn):
    def process(self, element: Any, ts: Any = beam.DoFn.TimestampParam,
                win: Any = beam.DoFn.WindowParam) -> Iterable[Observed]:
        for value in element if isinstance(element, list | ReportBatch) else [element]:
            if isinstance(win, window.GlobalWindow):
                yield Observed(value, ts.micros, None, None)
            else:
                yield Observed(value, ts.micros, win.start.micros, win.end.micros)


def _dump(elements: list[Observed], path: str) -> None:
    Path(path).write_bytes(pickle.dumps(elements))


_RUNS = itertools.count()


def run_pipeline(tmp_path: Path, build: Callable[[beam.Pipeline], Mapping[str, beam.PCollection]], *,
                 streaming: bool = False) -> PipelineRun:
    """Build with ``build``, run, return every named output and the ``esa`` counters."""
    out_dir = tmp_path / f"run{next(_RUNS)}"
    out_dir.mkdir()
    if streaming:
        options = PipelineOptions()
        options.view_as(StandardOptions).streaming = True
        pipeline = beam.Pipeline(runner=BundleBasedDirectRunner(), options=options)
    else:
        pipeline = beam.Pipeline(runner=FnApiRunner())
    outputs = build(pipeline)
    for name, pcoll in outputs.items():
        (pcoll
         | f"Observe_{name}" >> beam.ParDo(_Observe())
         | f"Global_{name}" >> beam.WindowInto(window.GlobalWindows(), trigger=trigger.AfterWatermark(),
                                               accumulation_mode=trigger.AccumulationMode.DISCARDING)
         | f"ToList_{name}" >> beam.combiners.ToList()
         | f"Dump_{name}" >> beam.Map(_dump, str(out_dir / f"{name}.pkl")))
    result = pipeline.run()
    assert result.wait_until_finish() == PipelineState.DONE
    return PipelineRun({name: pickle.loads((out_dir / f"{name}.pkl").read_bytes()) for name in outputs},
                       esa_counters(result))
