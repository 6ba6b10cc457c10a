"""Beam's DoFn and options inspection kept per object: the same answers as Beam's own, asked once.

The memo is process-wide (the jobs install it in ``run_pipeline``), so these tests install it in the test
process too; every later pipeline of the suite then runs with it, which is the point: it must change nothing.
"""

from __future__ import annotations

import gc

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer

from transforms.runtime.beam_memo import memoize_beam_inspection

BAG = BagStateSpec("seen", beam.coders.VarIntCoder())
TIMER = TimerSpec("flush", userstate.TimeDomain.WATERMARK)
BAG_P, TIMER_P = beam.DoFn.StateParam(BAG), beam.DoFn.TimerParam(TIMER)


class _Stateful(beam.DoFn):
    def process(self, kv, seen=BAG_P, flush=TIMER_P):
        seen.add(kv[1])
        yield kv[1]

    @on_timer(TIMER)
    def _flush(self, seen=BAG_P):
        return []


class _Plain(beam.DoFn):
    def process(self, x):
        yield x + 1


class _Duplicate(beam.DoFn):
    def process(self, kv, a=BAG_P, b=BAG_P):
        yield kv


@pytest.fixture(autouse=True)
def installed() -> None:
    memoize_beam_inspection()


def test_specs_are_beams_own_and_inspected_once_per_instance(monkeypatch) -> None:
    from apache_beam.runners import common

    original = userstate.get_dofn_specs.__wrapped__
    stateful, plain = _Stateful(), _Plain()
    assert userstate.get_dofn_specs(stateful) == original(stateful) == ({BAG}, {TIMER})
    assert userstate.get_dofn_specs(plain) == original(plain) == (set(), set())
    wrapped = []  # Beam wraps each method it inspects: none once an instance has been asked
    real = common.MethodWrapper
    monkeypatch.setattr(common, "MethodWrapper", lambda *a: wrapped.append(a) or real(*a))
    for _ in range(3):
        assert userstate.is_stateful_dofn(stateful) and not userstate.is_stateful_dofn(plain)
        userstate.validate_stateful_dofn(stateful)
    assert wrapped == []
    assert userstate.get_dofn_specs(_Plain()) == (set(), set()) and wrapped  # a new instance is inspected


def test_callers_get_fresh_sets_and_a_new_instance_is_asked_again() -> None:
    fn = _Stateful()
    state, _ = userstate.get_dofn_specs(fn)
    state.clear()  # a caller changing what it was given changes nothing kept
    assert userstate.get_dofn_specs(fn) == ({BAG}, {TIMER})
    del fn
    gc.collect()
    assert userstate.get_dofn_specs(_Plain()) == (set(), set())  # a new object at a recycled id: asked afresh


def test_an_invalid_dofn_raises_every_time() -> None:
    fn = _Duplicate()
    for _ in range(2):
        with pytest.raises(ValueError, match="duplicate"):
            userstate.get_dofn_specs(fn)


def test_views_share_values_and_follow_changes() -> None:
    options = PipelineOptions(["--runner", "DirectRunner", "--no_pipeline_type_check"])
    view = options.view_as(StandardOptions)
    assert options.view_as(StandardOptions) is view
    assert view.runner == "DirectRunner" and not options.view_as(TypeOptions).pipeline_type_check
    view.runner = "FlinkRunner"  # a view writes through to the options, as Beam's views do
    assert options.view_as(StandardOptions).runner == "FlinkRunner"
    assert PipelineOptions(["--runner", "DirectRunner"]).view_as(StandardOptions).runner == "DirectRunner"
    options._all_options = dict(options._all_options, runner="PrismRunner")  # values replaced: a new view
    assert options.view_as(StandardOptions).runner == "PrismRunner"


def test_stateful_and_plain_pipelines_run_as_before() -> None:
    with beam.Pipeline() as p:
        out = (p | beam.Create([("a", 1), ("a", 2), ("b", 3)]) | "Stateful" >> beam.ParDo(_Stateful())
               | "Plain" >> beam.ParDo(_Plain()))
        assert_that(out, equal_to([2, 3, 4]))
