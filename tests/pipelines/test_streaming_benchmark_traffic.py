"""The streaming benchmark's simulated traffic (benchmarks/streaming.py) has the shape its figures claim.

Pure numpy, no broker: one report per device and window, event times inside their window, out-of-order
reports delayed by at most the stated bound, late reports arriving only after their window's release
(so the shuffler must dead-letter them as late), and the stated fractions within binomial tolerances.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "streaming.py"
_spec = importlib.util.spec_from_file_location("streaming_benchmark", _PATH)
assert _spec is not None and _spec.loader is not None
streaming = importlib.util.module_from_spec(_spec)
sys.modules["streaming_benchmark"] = streaming  # dataclass lookups need the module registered
_spec.loader.exec_module(streaming)

HOURS, DEVICES, START = 24, 1000, 1_700_000_000_000 // 3_600_000 * 3_600_000
MAX_DELAY, LATE_AFTER, SPREAD = 600_000, 2_100_000, 900_000


@pytest.fixture(scope="module")
def traffic() -> object:
    spec = streaming.streaming_spec(300)
    return streaming.draw_traffic(spec, START, HOURS, DEVICES, 0.05, MAX_DELAY, 0.01, LATE_AFTER, SPREAD, seed=7)


def test_spec_is_the_example_with_hour_windows_and_short_lateness() -> None:
    spec = streaming.streaming_spec(300)
    assert (spec.name, spec.window_seconds, spec.allowed_lateness_seconds) == ("app_language", 3600, 300)


def test_one_report_per_device_and_window_inside_the_window(traffic: object) -> None:
    windows = HOURS + streaming.TAIL
    assert len(traffic.device) == windows * DEVICES
    pairs = traffic.window.astype(np.int64) * DEVICES + traffic.device
    assert len(np.unique(pairs)) == len(pairs)
    start = START + traffic.window * streaming.HOUR_MS
    assert np.all((traffic.event_ms >= start) & (traffic.event_ms < start + streaming.HOUR_MS))


def test_delays_and_fractions(traffic: object) -> None:
    delay = traffic.arrival_ms - traffic.event_ms
    assert np.all(delay[traffic.kind == 0] == 0)
    ooo = traffic.kind == 1
    assert np.all((delay[ooo] > 0) & (delay[ooo] <= MAX_DELAY))
    late = traffic.kind == 2
    window_end = START + (traffic.window + 1) * streaming.HOUR_MS
    assert np.all(traffic.arrival_ms[late] >= window_end[late] + LATE_AFTER)
    assert np.all(traffic.arrival_ms[late] < window_end[late] + LATE_AFTER + SPREAD)
    assert not np.any(late & (traffic.window >= HOURS))  # the tail carries no late reports
    main = traffic.window < HOURS
    n = int(main.sum())
    for kind, p in ((1, 0.05), (2, 0.01)):  # 5 binomial standard deviations
        assert abs(np.mean(traffic.kind[main] == kind) - p) < 5 * np.sqrt(p * (1 - p) / n)
