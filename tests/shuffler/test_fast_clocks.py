"""No device can push the watermark: it never runs ahead of the wall clock minus the out-of-orderness.

Issue 26, finding 3: the watermark was the minimum over partitions of (max authenticated event time - 600 s),
and ingress accepts times up to now + 1 h (the skew bound), so 12 of 600 honest devices whose clocks ran an
hour fast released the current window 35 minutes early (and made the other honest sets late); one enrolled
colluding device with 3 sets did the same. Sets from the future now wait in their own window.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.transforms.release_inputs import NOW_MS, WINDOW_MS, Devices, make_spec, shuffle_run
from transforms.shuffler.elements import TimePolicy
from transforms.shuffler.plan import WindowClock
from transforms.state.run_state import watermark_ms

MINUTE = 60_000
OOO = 10 * MINUTE  # out-of-orderness
SPEC = make_spec(min_clients=10)
HONEST, FAST = 600, 12


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("fast") / "keys", HONEST)


def _run(tmp_path: Path, devices: Devices, records: list, now_ms: int):
    clock = WindowClock(now_ms, OOO, 5 * MINUTE)
    tmp_path.mkdir()
    return shuffle_run(tmp_path, [SPEC], devices, records, clock=clock,
                       times=TimePolicy(now_ms, 30 * 86_400_000, 3_600_000))


def _records(devices: Devices, fast_offset_ms: int, colluder: bool) -> list:
    """Sets of the current window [NOW, NOW + 1 h) on 3 partitions, its first 35 minutes elapsed; 12 devices
    with clocks an hour fast, or (``colluder``) one enrolled device sending 3 sets stamped 59 minutes ahead."""
    out = []
    for i, client in enumerate(devices.clients):
        t = NOW_MS + (i * 7919) % (35 * MINUTE)
        if colluder and i < 3:
            client, t = devices.clients[0], NOW_MS + 35 * MINUTE + 59 * MINUTE
        elif not colluder and i < FAST:
            t = NOW_MS + 34 * MINUTE - i * 1000 + fast_offset_ms  # reported a minute ago, by a clock 1 h fast
        out.append(devices.record(devices.message_set(SPEC, client, t, [(i % SPEC.d,)]), partition=i % 3))
    return out


@pytest.mark.parametrize("colluder", [False, True], ids=["12-of-600-fast-clocks", "one-colluding-device"])
def test_fast_clocks_do_not_close_the_current_window_early(devices: Devices, tmp_path: Path, colluder: bool
                                                           ) -> None:
    now = NOW_MS + 35 * MINUTE  # 25 minutes before the window ends
    records = _records(devices, 60 * MINUTE, colluder)
    early = _run(tmp_path / "early", devices, records, now)
    assert early.values("released") == [] and early.count("sets_deleted") == 0
    assert early.count("dead_lettered") == 0 and early.count("sets_held") == len(records)
    # 11 minutes after the window's end (end + out-of-orderness has passed): it closes, with every honest set
    # on time; the future-stamped ones wait in the next window.
    # (by then honest devices report from the next window on every partition: that is what moves event time).
    fresh = [devices.record(devices.message_set(SPEC, devices.clients[100 + p], NOW_MS + WINDOW_MS + 10 * MINUTE,
                                                [(1,)]), partition=p) for p in range(3)]
    later = _run(tmp_path / "later", devices, records + fresh, NOW_MS + WINDOW_MS + 11 * MINUTE)
    closed = [p for p in later.values("released") if p.window_end_ms == NOW_MS + WINDOW_MS]
    n_current = HONEST - 3 if colluder else HONEST - FAST
    assert sum(p.n_sets for p in closed) + later.count("sets_deleted") == n_current
    assert later.count("sets_held") == (3 if colluder else FAST) + len(fresh)
    assert later.count("dead_lettered") == 0


def test_the_watermark_is_capped_by_the_wall_clock() -> None:
    now = NOW_MS + 35 * MINUTE
    ahead = {"p/0": now + 60 * MINUTE, "p/1": now + 59 * MINUTE}
    assert watermark_ms(ahead, {"p/0": now, "p/1": now}, now, OOO, 5 * MINUTE) == now - OOO
    idle = {"p/0": now - 20 * MINUTE}  # every partition idle: time moves on, still not past the wall clock
    assert watermark_ms(idle, {"p/0": now - 10 * MINUTE}, now, OOO, 5 * MINUTE) == now - 5 * MINUTE - OOO
    assert watermark_ms({"p/0": now - 30 * MINUTE}, {}, now, OOO, 5 * MINUTE) == now - 40 * MINUTE
