"""The whole streaming shuffle graph after its source (``StreamShuffle``) on Beam's streaming direct runner and on
Prism (``tests.transforms.streaming_runners``), fed
by a TestStream of Kafka record batches: every downstream group-by-key with its continuation trigger, the side
input of the shuffle, the staging of parts and the marker written once per window.

Checked against the bounded graph (``IngressFn`` + ``Shuffle`` with a drain clock on the FnApiRunner) over the
same records: the same release parts, byte for byte; sets arriving after their window fired are dead-lettered
as late and change nothing.
"""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from tests.transforms.release_inputs import KEY, TIMES_POLICY, WIN_A, WIN_B, WINDOW_MS, Devices, make_spec, shuffle_run
from tests.transforms.streaming_runners import STREAMING_RUNNERS, streaming_runner
from transforms.io.staging import load_staged, staged_entries, staged_files
from transforms.shuffler.streaming import DEAD_DIR, LATE_REASON, MARKER, PART, RELEASES, StreamShuffle
from transforms.state.prior_runs import PriorRuns

SPEC = make_spec(subkeys=4, min_clients=5)
N_A, N_B, N_LATE = 40, 30, 6


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("graph") / "keys", N_A + N_B + N_LATE)


def _released(root: Path) -> dict[int, tuple[list, object]]:
    """window end -> (staged parts in sub-key order, marker)."""
    out = {}
    for marker_path in staged_files(root / RELEASES, f"*/{MARKER}-*.pkl"):
        directory = Path(marker_path).parent
        (marker,) = load_staged(directory, MARKER)
        out[marker.crowd[2]] = (load_staged(directory, PART), marker)
    return out


@pytest.mark.parametrize("runner_name,in_state", [(r, False) for r in STREAMING_RUNNERS] + [("direct", True)])
def test_streaming_graph_releases_what_the_bounded_graph_releases(devices: Devices, tmp_path: Path,
                                                                  runner_name: str, in_state: bool) -> None:
    """Also with the joins in keyed state (``transforms.shuffler.release_join``, what the driver uses on Flink)."""
    clients = devices.clients
    win_a = devices.crowd(SPEC, clients[:N_A], WIN_A, partition=0)
    win_b = devices.crowd(SPEC, clients[N_A:N_A + N_B], WIN_B, partition=1)
    late = devices.crowd(SPEC, clients[N_A + N_B:], WIN_A, partition=0)  # after window A fired
    a_end = (WIN_A + WINDOW_MS) / 1000
    stream = (TestStream()
              .advance_watermark_to(WIN_A / 1000)
              .add_elements([TimestampedValue(win_a[:25], WIN_A / 1000), TimestampedValue(win_a[25:], WIN_A / 1000)])
              .add_elements([TimestampedValue(win_b, WIN_B / 1000)])
              .advance_watermark_to(a_end + 1)  # window A fires (lateness 0); B stays open
              .add_elements([TimestampedValue(late, a_end + 2)])
              .advance_watermark_to_infinity())
    root = tmp_path / "staging"
    runner, options = streaming_runner(runner_name)
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        _ = (pipeline | stream
             | StreamShuffle([SPEC], devices.registry, PriorRuns(), TIMES_POLICY, KEY, str(root), 86_400,
                             keys_dir=str(devices.keys_dir), join_in_state=in_state))

    released = _released(root)
    assert sorted(released) == [WIN_A + WINDOW_MS, WIN_B + WINDOW_MS]
    (tmp_path / "bounded").mkdir()
    reference = shuffle_run(tmp_path / "bounded", [SPEC], devices, win_a + win_b).values("released")
    for end, (parts, marker) in released.items():
        expected = sorted((p for p in reference if p.window_end_ms == end), key=lambda p: p.subkey)
        assert marker.subkeys == tuple(p.subkey for p in parts)
        assert [(p.subkey, p.n_sets, p.deleted, list(p.messages)) for p in parts] == \
            [(p.subkey, p.n_sets, p.deleted, list(p.messages)) for p in expected]
    assert sum(p.n_sets for p in released[WIN_A + WINDOW_MS][0]) > 0  # a real release, not a withheld window
    # (offsets continue across the runners' runs: the devices fixture numbers each partition's records)
    assert released[WIN_A + WINDOW_MS][1].source_ends == {"reports/0": win_a[-1].offset + 1}  # not the late ones
    assert released[WIN_B + WINDOW_MS][1].source_ends == {"reports/1": win_b[-1].offset + 1}
    assert late[0].offset > win_a[-1].offset
    letters = [entry.load() for path in staged_files(root / DEAD_DIR, "dead-*.pkl") for entry in staged_entries(path)]
    assert sorted(x["offset"] for x in letters) == [r.offset for r in late]
    assert {x["reason"] for x in letters} == {LATE_REASON}


def test_the_source_watermark_believes_only_authenticated_in_range_times(devices: Devices) -> None:
    from dataclasses import replace

    from transforms.io.kafka.unbounded import wall_ms
    from transforms.shuffler.streaming import SetEventTimes
    from transforms.trust.message_set import decode_message_set, encode_message_set

    now = wall_ms()
    policy = SetEventTimes([SPEC], devices.registry, max_age_ms=86_400_000, max_skew_ms=3_600_000,
                           keys_dir=str(devices.keys_dir))
    policy.setup()
    good = [devices.record(devices.message_set(SPEC, c, now - 60_000 * (i + 1), [(1,)]))
            for i, c in enumerate(devices.clients[:3])]
    signed_later = decode_message_set(devices.peel(devices.message_set(SPEC, devices.clients[3], now - 1000,
                                                                       [(1,)])))
    forged = devices.record(devices.envelope(encode_message_set(replace(signed_later, event_time_ms=now + 1_800_000))))
    too_far = devices.record(devices.message_set(SPEC, devices.clients[4], now + 2 * 3_600_000, [(1,)]))
    assert policy.max_event_ms(good) == now - 60_000
    # a forged time (signature no longer matches) and one beyond the skew bound move nothing
    assert policy.max_event_ms([*good, forged, too_far, devices.record(b"not a set")]) == now - 60_000
    assert policy.max_event_ms([forged, too_far]) is None
    # a bare set (not sealed to the shuffler) is not believed either
    bare = devices.record(devices.peel(devices.message_set(SPEC, devices.clients[3], now - 1000, [(1,)])))
    assert policy.max_event_ms([*good, bare]) == now - 60_000


def test_the_source_watermark_never_runs_ahead_of_the_wall_clock(devices: Devices) -> None:
    """An authenticated set from a device whose clock runs 30 min fast (inside the skew bound) counts as now,
    not as its own time: otherwise it would close the current window half an hour early (issue finding 3)."""
    from transforms.io.kafka.unbounded import PartitionWatermark, SourceClock, wall_ms
    from transforms.shuffler.streaming import SetEventTimes

    policy = SetEventTimes([SPEC], devices.registry, max_age_ms=86_400_000, max_skew_ms=3_600_000,
                           keys_dir=str(devices.keys_dir))
    policy.setup()
    before = wall_ms()
    fast = devices.record(devices.message_set(SPEC, devices.clients[0], before + 1_800_000, [(1,)]))
    believed = policy.max_event_ms([fast])
    assert believed is not None and before <= believed <= wall_ms()
    # and the partition's watermark, fed that time by a colluding source, stays at now - out-of-orderness
    mark = PartitionWatermark((None, None, before))
    mark.observe(before + 3_600_000, before)
    clock = SourceClock(out_of_orderness_ms=600_000, idle_timeout_ms=60_000)
    assert mark.advance(before, clock) == before - 600_000
