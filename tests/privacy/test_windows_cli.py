"""``esa privacy --windows`` and ``esa plan --windows --epsilon-central-total`` against the odometer."""

from __future__ import annotations

import json

import pytest

from pipelines.cli import main
from transforms.planning.planner import kv_alpha
from transforms.privacy.blanket_shuffle import blanket_grr
from transforms.privacy.crowd_count import design
from transforms.privacy.mixture import alpha_binary_rr, alpha_grr
from transforms.privacy.odometer import WindowRelease, compose_with_delta, cumulative_epsilon, interval_for


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_privacy_windows_matches_odometer(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, "privacy", "--mechanism", "grr", "--domain", "64", "--epsilon", "4", "--n", "20000",
                   "--delta", "1e-6", "--windows", "30", "--crowd-claim", "membership")
    block = report["windows"]
    assert block["notion"] == "replacement + membership"
    count = block["crowd_count"]
    sigma, threshold = design(1.0, 1e-6, 365, 1)
    assert (count["sigma"], count["threshold"], count["charges"]) == (sigma, threshold, 1)
    release = WindowRelease(alpha_grr(4.0, 64), 4.0, 20000, count_sigma=sigma, count_threshold=threshold,
                            count_charges=1, blanket=blanket_grr(4.0, 64).as_tuple())  # k-RR's blanket pair
    eps, delta_cum, _ = compose_with_delta([release] * 30, 1e-6, interval_for(report["eps_central"]))
    assert block["eps_central_total"] == pytest.approx(eps, rel=1e-12)
    assert block["delta_cumulative"] == pytest.approx(delta_cum, rel=1e-12)
    assert 0 < count["eps_count_total"] < block["eps_central_total"]
    assert set(block["cumulative"]) == {"1", "10", "30"}
    assert block["cumulative"]["1"] < block["cumulative"]["10"] < block["eps_central_total"]
    assert block["eps_central_total"] < block["basic_composition"] < block["local_composition"] == 120.0


def test_privacy_windows_rappor_agrees_with_its_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, "privacy", "--mechanism", "rappor", "--domain", "64", "--epsilon", "4", "--n", "19968",
                   "--delta", "1e-6", "--windows", "1")
    # the per-window value is at the exact n (within 1e-3 of the exact curve: test_privacy_fragments); the
    # odometer's at its 2% client grid, never below it and at most ~1% above
    assert report["eps_central"] <= report["windows"]["eps_central_total"] <= 1.011 * report["eps_central"]
    release = WindowRelease(alpha_binary_rr(4.0), 4.0, 19968, channels=2)
    assert report["windows"]["eps_central_total"] == pytest.approx(
        compose_with_delta([release], 1e-6, interval_for(report["eps_central"]))[0], rel=1e-12)


def test_plan_for_a_total_budget(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json(capsys, "plan", "--kind", "kv_mean", "--mechanism", "pckv-grr", "--d", "16", "--s", "2", "--n",
                 "20000", "--delta", "1e-6", "--windows", "100", "--epsilon-central-total", "3")
    block = plan["windows"]
    eps_local = plan["eps_local"]
    release = WindowRelease(kv_alpha("pckv-grr", 16, 2, eps_local), eps_local, 20000)
    # what the analyzer's ledger publishes for these windows (read at delta plus their ~1e-22 infinite mass)
    total, delta_cum, _ = compose_with_delta([release] * 100, 1e-6, interval_for(plan["eps_central"]))
    assert delta_cum < 1e-6 * (1 + 1e-6) and block["notion"] == "replacement"
    assert total == pytest.approx(block["eps_central_total"], rel=1e-9)
    assert 0.99 * 3 <= total <= 3  # meets the budget and uses (nearly) all of it
    bigger = WindowRelease(kv_alpha("pckv-grr", 16, 2, 1.01 * eps_local), 1.01 * eps_local, 20000)
    assert cumulative_epsilon([bigger] * 100, 1e-6) > 3


def test_windows_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "--mechanism", "grr", "--domain", "8", "--epsilon", "1", "--n", "1000", "--delta",
                 "1e-6", "--crowd-claim", "partition"]) != 0
    assert main(["privacy", "--mechanism", "grr", "--domain", "8", "--epsilon", "1", "--n", "1000", "--delta",
                 "1e-6", "--windows", "3", "--crowd-claim", "everything"]) != 0
    assert main(["plan", "--kind", "kv_mean", "--mechanism", "privkv", "--d", "4", "--s", "1", "--n", "1000",
                 "--delta", "1e-6", "--windows", "3"]) != 0
