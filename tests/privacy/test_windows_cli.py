"""``esa privacy --windows`` and ``esa plan --windows --epsilon-central-total`` against the odometer."""

from __future__ import annotations

import json

import pytest

from pipelines.cli import main
from transforms.privacy.mixture import alpha_binary_rr, alpha_grr
from transforms.privacy.odometer import WindowRelease, cumulative_epsilon
from transforms.privacy.planner import kv_alpha


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_privacy_windows_matches_odometer(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, "privacy", "--mechanism", "grr", "--domain", "64", "--epsilon", "4", "--n", "20000",
                   "--delta", "1e-6", "--windows", "30", "--crowd-epsilon", "0.5", "--crowd-delta", "1e-10")
    block = report["windows"]
    release = WindowRelease(alpha_grr(4.0, 64), 4.0, 20000, 0.5, 1e-10)
    assert block["eps_central_total"] == pytest.approx(cumulative_epsilon([release] * 30, 1e-6), rel=1e-12)
    assert set(block["cumulative"]) == {"1", "10", "30"}
    assert block["cumulative"]["1"] < block["cumulative"]["10"] < block["eps_central_total"]
    assert block["eps_central_total"] < block["basic_composition"] < block["local_composition"] == 120.0


def test_privacy_windows_rappor_agrees_with_its_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, "privacy", "--mechanism", "rappor", "--domain", "64", "--epsilon", "4", "--n", "19968",
                   "--delta", "1e-6", "--windows", "1")
    assert report["windows"]["eps_central_total"] == pytest.approx(report["eps_central"], rel=1e-12)
    release = WindowRelease(alpha_binary_rr(4.0), 4.0, 19968)
    assert report["eps_central"] == pytest.approx(cumulative_epsilon([release] * 2, 1e-6), rel=1e-12)


def test_plan_for_a_total_budget(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json(capsys, "plan", "--kind", "kv_mean", "--mechanism", "pckv-grr", "--d", "16", "--s", "2", "--n",
                 "20000", "--delta", "1e-6", "--windows", "100", "--epsilon-central-total", "3")
    block = plan["windows"]
    eps_local = plan["eps_local"]
    release = WindowRelease(kv_alpha("pckv-grr", 16, 2, eps_local), eps_local, 20000)
    total = cumulative_epsilon([release] * 100, 1e-6)
    assert total == pytest.approx(block["eps_central_total"], rel=1e-12)
    assert 0.99 * 3 <= total <= 3  # meets the budget and uses (nearly) all of it
    bigger = WindowRelease(kv_alpha("pckv-grr", 16, 2, 1.01 * eps_local), 1.01 * eps_local, 20000)
    assert cumulative_epsilon([bigger] * 100, 1e-6) > 3


def test_windows_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "--mechanism", "grr", "--domain", "8", "--epsilon", "1", "--n", "1000", "--delta",
                 "1e-6", "--crowd-epsilon", "1"]) != 0
    assert main(["plan", "--kind", "kv_mean", "--mechanism", "privkv", "--d", "4", "--s", "1", "--n", "1000",
                 "--delta", "1e-6", "--windows", "3"]) != 0
