"""The shuffler's steps one at a time: quota, multi-message sets, min_clients, whole-set deletion, unlinkable
order, open windows held and closed ones released, and what earlier runs decided (``PriorRuns``).

DoFns are called directly (``setup`` + ``process``) on sets of enrolled simulated devices, except the
held/closed test, which runs the composite on the FnApiRunner to see the ``held`` output as the driver does.
"""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from tests.transforms.release_inputs import (
    KEY,
    NOW_MS,
    WIN_A,
    WIN_B,
    WINDOW_MS,
    Devices,
    drain_clock,
    ingress_fn,
    make_spec,
    shuffle_run,
    split_outputs,
)
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.randomness import keyed_generator
from transforms.privacy.crowd import crowd_threshold
from transforms.shuffler.elements import DEAD, TIMES
from transforms.shuffler.graph import (
    WITHHELD,
    CrowdThresholdFn,
    DedupeAndStripFn,
    ReleaseFn,
    WindowClock,
    discrete_laplace,
    noisy_crowd_target,
)
from transforms.spec import AnalysisSpec
from transforms.state.prior_runs import PriorRuns
from transforms.wire.rows import PRESENCE

SPEC = make_spec()
RAPPOR = make_spec("rappor", size=6, name="frag_steps")


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("steps") / "keys", 60)


def dedupe(specs: list[AnalysisSpec], devices: Devices, records: Iterable[KafkaRecord],
           clock: WindowClock | None = None) -> tuple[list, dict[str, list]]:
    """IngressFn then DedupeAndStripFn per key, as GroupByKey would feed it."""
    main, tagged = split_outputs(ingress_fn(specs, devices).process(list(records)))
    assert DEAD not in tagged, tagged.get(DEAD)
    groups: dict[tuple, list[bytes]] = {}
    for key, blob in main:
        groups.setdefault(key, []).append(blob)
    fn = DedupeAndStripFn(specs, KEY, clock or drain_clock())
    outputs = [out for kv in groups.items() for out in fn.process(kv, dict(tagged.get(TIMES, [])))]
    return split_outputs(outputs)


def kept_units(main: list) -> list[tuple[int, tuple]]:
    """What dedupe keeps: one unit per device, (its set count, the messages of its kept sets)."""
    return [u for _, (_, units) in main for u in units]


# --- one set per device and window, quotas, multi-message sets -----------------------------------------------

def test_a_quota_of_two_keeps_the_two_earliest_sets(devices: Devices) -> None:
    spec = make_spec(quota=2, name="quota2")
    mid, late, early = (devices.record(devices.message_set(spec, "c0", t, [(v,)]))
                        for t, v in ((WIN_A + 1800_000, 1), (WIN_A + WINDOW_MS - 1, 2), (WIN_A, 3)))
    main, tagged = dedupe([spec], devices, [mid, late, early])
    (letter,) = tagged[DEAD]
    assert letter["offset"] == late.offset and "already sent 2 set(s)" in letter["reason"]
    (unit,) = kept_units(main)  # the threshold counts (and deletes) devices, not sets
    assert unit[0] == 2 and len(unit[1]) == 2



def test_an_identical_copy_of_any_kept_set_is_a_duplicate_not_another_set(devices: Devices) -> None:
    # With a quota above 1, a replay of the device's *second* set must not count as a third one.
    spec = make_spec(quota=3, name="quota3")
    first = devices.record(devices.message_set(spec, "c0", WIN_A + 10, [(1,)]))
    second = devices.record(devices.message_set(spec, "c0", WIN_A + 20, [(2,)]))
    replay = devices.record(second.value)
    main, tagged = dedupe([spec], devices, [first, second, replay])
    assert DEAD not in tagged  # counted as a duplicate (sets_duplicate), never another set nor a dead letter
    (unit,) = kept_units(main)
    assert unit[0] == 2

def test_lone_devices_and_repeated_ones_in_one_window_keep_what_the_per_device_rules_keep(
        devices: Devices) -> None:
    """Dedupe takes the devices with one set in a vectorized pass and loops over the rest: in one window, lone
    devices, a device over its quota and a replayed copy each get the per-device verdict, every unit once,
    ranked by the keyed PRF of its device."""
    from transforms.mechanisms.randomness import keyed_index

    spec = make_spec(quota=2, name="mixed_quota")
    lone = [devices.record(devices.message_set(spec, f"c{i}", WIN_A + 100 * i, [(i % 8,)])) for i in range(1, 9)]
    repeated = [devices.record(devices.message_set(spec, "c0", WIN_A + t, [(v,)]))
                for t, v in ((10, 1), (20, 2), (30, 3))]
    copy = devices.record(lone[3].value)
    main, tagged = dedupe([spec], devices, [*lone[:4], repeated[2], copy, *repeated[:2], *lone[4:]])
    (letter,) = tagged[DEAD]  # c0's third set (latest event time); the copy of c4's set is no dead letter
    assert letter["offset"] == repeated[2].offset and "already sent 2 set(s)" in letter["reason"]
    units = [(rank, n_sets) for _, (_, packed) in main for rank, n_sets in zip(packed.ranks.tolist(),
                                                                                packed.n_sets.tolist(), strict=True)]
    window_end = WIN_A + WINDOW_MS
    expected = {keyed_index(KEY, f"{spec.spec_id}/None/{window_end}/{devices.device_id(c)}", 1 << 64): n
                for c, n in [("c0", 2)] + [(f"c{i}", 1) for i in range(1, 9)]}
    assert sorted(units) == sorted(expected.items())


def rappor_set(devices: Devices, client: str, channels: list[int]) -> KafkaRecord:
    return devices.record(devices.message_set(RAPPOR, client, WIN_A + 5, [(c,) for c in channels]))


@pytest.mark.parametrize(("channels", "reason"), [
    ([1, 2], "0 presence markers"),
    ([PRESENCE, PRESENCE, 1], "2 presence markers"),
    ([PRESENCE, 3, 3], "flood: 2 messages on channel 3"),
])
def test_multi_message_sets_need_one_marker_and_respect_the_channel_quota(devices: Devices, channels: list[int],
                                                                          reason: str) -> None:
    good = rappor_set(devices, "c1", [PRESENCE, 1, 2])
    bad = rappor_set(devices, "c2", channels)
    main, tagged = dedupe([RAPPOR], devices, [good, bad])
    (letter,) = tagged[DEAD]
    assert letter["offset"] == bad.offset and reason in letter["reason"]
    (kept,) = kept_units(main)
    assert kept[0] == 1 and [c for c, _ in kept[1]] == [PRESENCE, 1, 2]


# --- crowd threshold decisions ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("min_clients", "released"), [(12, False), (11, True)])
def test_min_clients_withholds_a_release_below_it(min_clients: int, released: bool) -> None:
    # eps_cr = 30, delta_cr = 0.5: T = (2/30) ln 4 = 0.092 and q = exp(-15): L = 0 except with probability
    # 2q/(1+q) = 6e-7, so n_hat = floor(12 - 0.092) = 11 sets out of 12.
    spec = make_spec(crowd_epsilon=30, crowd_delta=0.5, min_clients=min_clients, name=f"min{min_clients}")
    crowd = (spec.spec_id, None, WIN_A + WINDOW_MS)
    decisions = dict(CrowdThresholdFn([spec], KEY).process((crowd, [(2, 5), (0, 4), (3, 3)])))
    assert set(decisions) == {(crowd, k) for k in (0, 2, 3)}
    if released:
        assert sum(decisions.values()) == 1 and min(decisions.values()) >= 0
    else:
        assert set(decisions.values()) == {WITHHELD}



def test_threshold_decisions_follow_algorithm_3_and_aborts_are_never_clamped() -> None:
    # delta_cr = 0.9: T = 2 ln(2/0.9) = 1.597, so a crowd of 20 aborts (n_hat > n) when L >= 3, probability
    # q^3/(1+q) = 0.139 per crowd: over 60 crowds P[no abort] = 0.861^60 = 1.3e-4 (and the key is fixed).
    # Each decision is checked against n_hat recomputed from the crowd's keyed noise draw.
    spec = make_spec(crowd_delta=0.9, min_clients=10, name="aborts")
    fn = CrowdThresholdFn([spec], KEY)
    threshold = crowd_threshold(1.0, 0.9)
    outcomes = Counter()
    for k in range(60):
        crowd = (spec.spec_id, None, WIN_A + (k + 1) * WINDOW_MS)
        decisions = dict(fn.process((crowd, [(0, 8), (1, 12)])))
        rng = keyed_generator(KEY, "threshold", spec.spec_id, "None", crowd[2])
        n_hat = noisy_crowd_target(20, discrete_laplace(rng, 1.0), threshold)
        if n_hat > 20 or n_hat < 10:
            assert set(decisions.values()) == {WITHHELD}
            outcomes["aborted" if n_hat > 20 else "suppressed"] += 1
        else:
            deleted = [decisions[(crowd, 0)], decisions[(crowd, 1)]]
            assert sum(deleted) == 20 - n_hat and 0 <= deleted[0] <= 8 and 0 <= deleted[1] <= 12
            outcomes["released"] += 1
    assert outcomes["aborted"] >= 1 and outcomes["released"] >= 1

def release(spec: AnalysisSpec, sets: list[tuple], decision: int) -> list:
    """Release one device per set (each device's unit holds one set)."""
    crowd = (spec.spec_id, None, WIN_A + WINDOW_MS)
    units = [(1, s) for s in sets]
    return list(ReleaseFn([spec], KEY).process(((crowd, 1), {"sets": [units], "decision": [decision]})))


def numbered_sets(n: int) -> list[tuple]:
    """n sets of (marker, channel j, channel j+1) whose blobs say which set and message they are."""
    return [((PRESENCE, b"s%d-0" % i), (i % 6, b"s%d-1" % i), ((i + 1) % 6, b"s%d-2" % i)) for i in range(n)]


@pytest.mark.parametrize("publish", [False, True])
def test_deletions_are_whole_sets_and_their_count_is_published_only_on_request(publish: bool) -> None:
    spec = make_spec("rappor", size=6, publish=publish, name=f"pub{publish}")
    (part,) = release(spec, numbered_sets(40), 7)
    owners = [blob.split(b"-")[0] for _, blob in part.messages]
    per_set = np.unique(owners, return_counts=True)[1]
    assert len(per_set) == part.n_sets == 33 and set(per_set.tolist()) == {3}
    assert part.deleted == (7 if publish else None)
    (withheld,) = release(spec, numbered_sets(40), WITHHELD)  # an empty part: the window closed with nothing
    assert withheld.n_sets == 0 and withheld.messages == () and withheld.deleted is None


def test_two_messages_of_a_set_are_adjacent_no_more_often_than_chance() -> None:
    # 300 sets of 3 messages permuted uniformly: each of the 899 adjacent pairs joins two messages of one set
    # with probability 2/899, so the expected number of such pairs is exactly 2 (Poisson-like; P[> 12] < 1e-6).
    # The input order would give 600.
    (part,) = release(RAPPOR, numbered_sets(300), 0)
    owners = [blob.split(b"-")[0] for _, blob in part.messages]
    assert len(owners) == 900
    together = sum(a == b for a, b in itertools.pairwise(owners))
    assert together <= 12, together


# --- open windows held, closed windows released -------------------------------------------------------------------

def test_open_windows_are_held_at_their_earliest_offset_per_partition(tmp_path: Path, devices: Devices) -> None:
    closed = devices.crowd(SPEC, devices.clients[:50], WIN_A, partition=2)
    open_p0 = [devices.record(devices.message_set(SPEC, c, NOW_MS - 60_000 - i, [(1,)]), partition=2)
               for i, c in enumerate(devices.clients[50:53])]  # after window A's sets; window ends at NOW_MS
    open_p1 = [devices.record(devices.message_set(SPEC, c, NOW_MS - 1000, [(2,)]), partition=3, offset=7 + i)
               for i, c in enumerate(devices.clients[53:55])]
    clock = WindowClock(NOW_MS, 600_000, 300_000)  # watermark = NOW_MS - 1000 - 600 s: window A closed
    run = shuffle_run(tmp_path, [SPEC], devices, closed + open_p0[::-1] + open_p1, clock=clock)
    assert dict(run.values("held")) == {"reports/2": open_p0[0].offset, "reports/3": 7}
    assert open_p0[0].offset == closed[-1].offset + 1
    assert {p.window_end_ms for p in run.values("released")} == {WIN_A + WINDOW_MS}
    assert run.count("sets_held") == 5 and run.count("crowds_released") == 1
    assert run.count("sets_deleted") + run.count("sets_released") == 50


def test_window_clock_out_of_orderness_idleness_and_drain() -> None:
    ooo, idle = 600_000, 300_000
    prior_max = {"reports/0": NOW_MS - 2 * WINDOW_MS, "reports/1": NOW_MS - 5 * WINDOW_MS}
    quiet = WindowClock(NOW_MS, ooo, idle, prior_max, {"reports/0": NOW_MS - 1000, "reports/1": NOW_MS - idle - 1})
    busy = WindowClock(NOW_MS, ooo, idle, prior_max, {"reports/0": NOW_MS - 1000, "reports/1": NOW_MS - 1000})
    run_max = {"reports/0": NOW_MS - 1000}
    # Partition 1 is idle for the first clock: only partition 0 (this run's data) holds the watermark back.
    assert quiet.watermark(run_max) == NOW_MS - 1000 - ooo
    # An active partition with older data holds every window open until it catches up.
    assert busy.watermark(run_max) == NOW_MS - 5 * WINDOW_MS - ooo
    mark = quiet.watermark(run_max)
    end = NOW_MS - WINDOW_MS  # closed; the next window ends within out-of-orderness of the newest event
    assert quiet.closed(end, 0, mark) and not quiet.closed(end + WINDOW_MS, 0, mark)
    assert not quiet.closed(end, 3_600_000, mark)  # allowed lateness keeps it open
    drain = WindowClock(NOW_MS, ooo, idle, drain=True)
    assert drain.watermark(run_max) is None and drain.closed(NOW_MS + 10 * WINDOW_MS, 86_400_000, None)
    assert not WindowClock(NOW_MS, ooo, idle).closed(WIN_A, 0, None)  # no data: nothing closes


# --- what earlier runs decided ------------------------------------------------------------------------------------

def test_released_windows_skip_re_read_sets_and_dead_letter_new_ones(devices: Devices) -> None:
    a_sets = devices.crowd(SPEC, devices.clients[:12], WIN_A, partition=5)  # offsets 0..11
    b_sets = devices.crowd(SPEC, devices.clients[:3], WIN_B, partition=5)  # offsets 12..14
    prior = PriorRuns(processed_until={"reports/5": 11},
                      released={(SPEC.spec_id, None, WIN_A + WINDOW_MS): {"reports/5": 10}})
    main, tagged = split_outputs(ingress_fn([SPEC], devices, prior).process(a_sets + b_sets))
    # Offsets 0..9 were part of the release (re-read, skipped); 10 was already dead-lettered as late by the
    # run that ended at 11 (skipped, not dead-lettered twice); 11 is new and late.
    assert [d["offset"] for d in tagged[DEAD]] == [11]
    assert "late: its window was already released" in tagged[DEAD][0]["reason"]
    sets = [s for _, blob in main for s in pickle.loads(blob)]
    assert sorted(s.source.offset for s in sets) == [12, 13, 14]
    assert {s.window_end_ms for s in sets} == {WIN_B + WINDOW_MS}


def test_records_a_previous_run_dead_lettered_are_skipped(devices: Devices) -> None:
    junk = [devices.record(b"\x00not a message set", partition=6) for _ in range(4)]  # offsets 0..3
    prior = PriorRuns(processed_until={"reports/6": 2})
    main, tagged = split_outputs(ingress_fn([SPEC], devices, prior).process(junk))
    assert main == [] and [d["offset"] for d in tagged[DEAD]] == [2, 3]


def test_a_claimed_count_draws_the_yearly_discrete_gaussian() -> None:
    """With a partition the count is charged, so the shuffler uses the yearly-designed discrete Gaussian
    (sigma, T of ``crowd_count.design``): each decision equals n_hat recomputed from the crowd's keyed draw."""
    from transforms.privacy.crowd_count import design, discrete_gaussian, windows_per_year

    spec = make_spec(partition="app_version", min_clients=1, name="gaussian")
    sigma, threshold = design(1.0, 1e-6, windows_per_year(WINDOW_MS // 1000), 2)
    assert spec.crowd.count_design(WINDOW_MS // 1000) == (sigma, threshold)
    fn = CrowdThresholdFn([spec], KEY)
    n = threshold + 4 * round(sigma)  # large enough to be released most of the time
    released = 0
    for k in range(20):
        crowd = (spec.spec_id, "v1", WIN_A + (k + 1) * WINDOW_MS)
        decisions = dict(fn.process((crowd, [(0, n // 2), (1, n - n // 2)])))
        rng = keyed_generator(KEY, "threshold", spec.spec_id, "v1", crowd[2])
        n_hat = noisy_crowd_target(n, discrete_gaussian(rng, sigma), float(threshold))
        if n_hat > n or n_hat < 1:
            assert set(decisions.values()) == {WITHHELD}
        else:
            released += 1
            assert sum(decisions.values()) == n - n_hat
    assert released >= 19
