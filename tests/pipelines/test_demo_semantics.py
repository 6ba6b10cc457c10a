"""What the demo and ``esa simulate`` say and draw: fresh clients and recent windows per call, seeds only when
asked for, populations inside the mechanism's input domain, and the right name for ``[mechanism] epsilon``."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest

import transforms.mechanisms.randomness as randomness
from pipelines.demo.plots import ledger_title
from pipelines.demo.population import recent_windows_start, synthesize
from pipelines.demo.run import epsilon_is_central_target, ledger_lines
from pipelines.demo.simulate import bad_records
from pipelines.demo.value_laws import l2_shrink
from transforms.spec import load_spec, spec_from_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_each_simulation_has_fresh_clients_in_recent_windows() -> None:
    spec = load_spec(EXAMPLES / "app_language.toml")
    window_ms = spec.window_seconds * 1000
    before = int(time.time() * 1000)
    a, b = synthesize(spec, 50, windows=2), synthesize(spec, 50, windows=2)
    assert not set(a.client_ids) & set(b.client_ids)
    now_window = before // window_ms * window_ms
    for population in (a, b):
        assert now_window - 2 * window_ms <= population.event_times_ms.min()
        assert population.event_times_ms.max() < now_window + window_ms  # the call may cross a window edge
    assert recent_windows_start(window_ms, 3, now_ms=10 * window_ms + 5) == 7 * window_ms


def test_a_seed_and_start_time_reproduce_a_simulation() -> None:
    spec = load_spec(EXAMPLES / "app_language.toml")
    a, b = (synthesize(spec, 40, seed=5, start_ms=3_600_000) for _ in range(2))
    assert list(a.client_ids) == list(b.client_ids) and np.array_equal(a.event_times_ms, b.event_times_ms)
    assert a.event_times_ms.min() >= 3_600_000 and a.event_times_ms.max() < 7_200_000


def test_no_seeded_randomness_warning_without_a_seed(monkeypatch, caplog) -> None:
    monkeypatch.setattr(randomness, "_seeded_warned", False)
    spec = load_spec(EXAMPLES / "app_language.toml")
    with caplog.at_level(logging.WARNING):
        bad_records(spec, synthesize(spec, 20), per_kind=2)
    assert not [r for r in caplog.records if "seeded" in r.getMessage()]
    with caplog.at_level(logging.WARNING):
        synthesize(spec, 20, seed=1)
    assert [r for r in caplog.records if "seeded" in r.getMessage()]


def test_ldp_sgd_demo_vectors_lie_in_its_l2_ball() -> None:
    """ldp_sgd clips to L2 norm <= clip: [0, 1]^16 vectors (norm up to 4) used to be clipped silently."""
    spec = load_spec(EXAMPLES / "sensor_vector.toml").with_mechanism("ldp_sgd", 2.0)
    population = synthesize(spec, 2000, seed=3)
    norms = np.linalg.norm(population.values, axis=1)
    assert norms.max() <= spec.randomizer.clip + 1e-12
    assert population.values.min() >= 0.0  # still inside the value range
    # the shrink is the largest that fits the box's farthest corner: the factor is clip / (sqrt(d) * 1) = 1/4
    anchor, factor = l2_shrink(spec)
    assert factor == pytest.approx(0.25) and not anchor.any()
    assert l2_shrink(load_spec(EXAMPLES / "sensor_vector.toml")) is None  # vector_sum maps its own range


def test_ldp_sgd_refuses_a_value_range_outside_its_ball() -> None:
    spec = spec_from_dict({"analysis": {"name": "far", "kind": "vector_mean", "metric": "m"},
                           "domain": {"dimension": 4, "value_range": [2.0, 3.0]},
                           "mechanism": {"name": "ldp_sgd", "epsilon": 1.0}})
    with pytest.raises(ValueError, match="L2 norm <= clip"):
        synthesize(spec, 10, seed=1)


def _facts(spec_file: str, eps_local: float) -> dict:
    spec = load_spec(EXAMPLES / spec_file)
    return {"mechanism": spec.mechanism, "messages_per_client": 1.0, "eps_local": eps_local, "eps_central": 0.5,
            "epsilon_spec": spec.epsilon, "n_clients": 100, "delta": 1e-6,
            "epsilon_role": "central target" if epsilon_is_central_target(spec.randomizer) else "local"}


def test_epsilon_is_named_by_what_it_means() -> None:
    local = dict(ledger_lines(_facts("app_language.toml", 2.0)))
    assert list(local) == ["eps_local"]
    vector = dict(ledger_lines(_facts("sensor_vector.toml", 1.478)))
    assert vector["target eps_central (spec epsilon)"] == "1" and "1.478" in vector[
        "eps_local (implied by the target)"]
    multi = _facts("latency_range_multimessage.toml", float("inf"))
    lines = dict(ledger_lines(multi))
    assert lines["eps_local"].startswith("inf: no local guarantee: multi-message protocol, central only")
    assert "no local guarantee" in ledger_title(multi) and "target ε_central=1" in ledger_title(
        _facts("sensor_vector.toml", 1.478))
