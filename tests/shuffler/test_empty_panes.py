"""Every step of the shuffle after a group-by-key ignores an empty group: Beam's Python SDK asks for
``closing_behavior=EMIT_ALWAYS``, so a runner that does its windowing in Java (Flink) emits an empty closing
pane per window when the watermark passes end + allowed lateness -- at once for every window when a streaming
job drains. Measured on Beam 2.62's Flink 1.19 runner: before these guards the drain failed in
``DedupeAndStrip`` ("nothing to concatenate"), the job restarted from its checkpoint in a loop and no window
was ever released. The Python runners and Prism send no such pane, so the steps are called directly here."""

from __future__ import annotations

from tests.transforms.release_inputs import KEY, drain_clock, make_spec
from transforms.shuffler.dedupe import DedupeAndStripFn
from transforms.shuffler.streaming import LateGateFn, MarkReleaseFn
from transforms.shuffler.threshold import CrowdThresholdFn, ReleaseFn

SPEC = make_spec()
CROWD = (SPEC.spec_id, None, 3_600_000)



def test_dedupe_ignores_an_empty_pane() -> None:
    assert list(DedupeAndStripFn([SPEC], KEY, drain_clock()).process(((*CROWD, 0), []), {})) == []


def test_threshold_ignores_an_empty_pane() -> None:
    assert list(CrowdThresholdFn([SPEC], KEY).process((CROWD, []))) == []


def test_release_ignores_an_empty_pane() -> None:
    assert list(ReleaseFn([SPEC], KEY).process(((CROWD, 0), {"sets": [], "decision": []}))) == []


def test_late_gate_and_marker_ignore_an_empty_pane(tmp_path) -> None:
    from apache_beam.utils.windowed_value import PaneInfoTiming

    for timing in (PaneInfoTiming.ON_TIME, PaneInfoTiming.LATE):
        pane = type("Pane", (), {"timing": timing})()
        assert list(LateGateFn().process(((*CROWD, 0), []), pane)) == []
    assert list(MarkReleaseFn(str(tmp_path)).process((CROWD, {"parts": [], "ends": []}))) == []
    assert list(tmp_path.iterdir()) == []


def test_an_empty_pane_of_sub_crowd_sizes_is_no_size() -> None:
    """A closing pane out of ``CombinePerKey(sum)`` would be a size of 0 for a sub-crowd that already has one:
    two decisions for one sub-crowd (what Flink did at a drain); the shuffle sums a group instead."""
    from transforms.shuffler.graph import _summed

    assert _summed(((CROWD, 0), [])) == []
    assert _summed(((CROWD, 0), [3, 4])) == [((CROWD, 0), 7)]
