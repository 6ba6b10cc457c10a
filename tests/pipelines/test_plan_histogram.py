"""``esa plan --kind histogram``: each oracle's local epsilon meets the central target (checked with the tight
bound recomputed here) and is the largest that does; the stderr is the mechanism's closed form; a stderr target
gives the smallest epsilon reaching it; windows compose to the total budget."""

from __future__ import annotations

import json
import math

import pytest

from pipelines.cli import main
from transforms.planning.histogram import histogram_mechanism, plan_histogram
from transforms.privacy.events import central_epsilon, window_event
from transforms.privacy.mixture import alpha_grr, alpha_oue
from transforms.privacy.shuffle_bound import epsilon_central

D, N, DELTA = 8, 4000, 1e-6


def grr_stderr(eps: float, d: int, n: int) -> float:
    """GRR's count variance at a uniform population (c = n/d), written out: (c p(1-p) + (n-c) q(1-q))/(p-q)^2."""
    e = math.exp(eps)
    p, q, c = e / (e + d - 1), 1 / (e + d - 1), n / d
    return math.sqrt((c * p * (1 - p) + (n - c) * q * (1 - q)) / (p - q) ** 2) / n


def test_central_target_is_met_and_maximal() -> None:
    """The plan's local epsilon meets the target in the bound the rows publish (the smallest valid one:
    ``events.central_epsilon``) and is the largest that does; the generic clone pair alone would miss it."""
    plan = plan_histogram(D, N, DELTA, epsilon_central=0.8, mechanisms=("grr", "oue"))
    grr, oue = plan.options
    for option, alpha in ((grr, alpha_grr(grr.eps_local, D)), (oue, alpha_oue(oue.eps_local))):
        assert option.alpha == pytest.approx(alpha, rel=1e-12)
        assert option.eps_central == _published(option.mechanism, option.eps_local) <= 0.8 * (1 + 1e-9)
        assert _published(option.mechanism, option.eps_local * 1.001) > 0.8
        assert epsilon_central(N, alpha, option.eps_local, DELTA) > 0.8  # the generic pair alone: over target
    assert grr.stderr == pytest.approx(grr_stderr(grr.eps_local, D, N), rel=1e-12)
    # at d = 8 GRR beats OUE at the same central budget (small domain): it is recommended
    assert grr.stderr < oue.stderr and plan.recommended == "grr"


def _published(name: str, eps: float) -> float:
    return central_epsilon(window_event(histogram_mechanism(name, D, eps), N, DELTA)).epsilon


@pytest.mark.parametrize(("mechanism", "d"), [("grr", 8), ("olh", 64)])
def test_esa_plan_agrees_with_esa_privacy(capsys: pytest.CaptureFixture, mechanism: str, d: int) -> None:
    """``esa plan`` plans with the bound ``esa privacy`` prints at the planned setting (the blanket pair where
    the randomizer declares a decomposition): same eps_central, within the target, blanket-bound."""
    setting = ["--n", "1000", "--delta", "1e-6", "--json"]
    assert main(["plan", "--kind", "histogram", "--d", str(d), "--epsilon-central", "0.3", "--mechanism",
                 mechanism, *setting]) == 0
    (option,) = json.loads(capsys.readouterr().out)["options"]
    assert main(["privacy", "--mechanism", mechanism, "--domain", str(d), "--epsilon", repr(option["eps_local"]),
                 *setting]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["eps_central"] == option["eps_central"] <= 0.3 * (1 + 1e-9)
    assert report["eps_central_bound"] == "blanket pair" and report["eps_central_generic"] > 0.3
    assert option["eps_local"] > 2.0  # the generic pair would plan below 2 (0.397 at eps_local 2)


def test_stderr_target_gives_the_smallest_epsilon() -> None:
    target = 0.02
    plan = plan_histogram(D, N, DELTA, target_stderr=target, mechanisms=("grr", "olh", "hadamard"))
    by_name = {o.mechanism: o for o in plan.options}
    grr = by_name["grr"]
    assert grr.stderr <= target < grr_stderr(grr.eps_local * 0.999, D, N)
    olh = by_name["olh"]
    smaller = histogram_mechanism("olh", D, olh.eps_local * 0.999)
    assert olh.stderr <= target
    assert math.sqrt(smaller.variance([N / D] * D, N)[0]) / N > target
    reachable = [o for o in plan.options if o.feasible]
    assert plan.recommended == min(reachable, key=lambda o: o.eps_central).mechanism
    # Hadamard response's variance never falls below ~ n/4 / (1/4): stderr ~ 1/sqrt(n) = 0.0158 at any epsilon
    tight = plan_histogram(D, N, DELTA, target_stderr=0.01, mechanisms=("grr", "hadamard"))
    assert [o.feasible for o in tight.options] == [True, False] and "unreachable" in tight.options[1].note


def test_rappor_is_planned_with_its_own_ledger() -> None:
    (option,) = plan_histogram(D, N, DELTA, epsilon_central=1.0, mechanisms=("rappor",)).options
    assert option.eps_central <= 1.0 * (1 + 1e-9)
    above = histogram_mechanism("rappor", D, option.eps_local * 1.01)
    assert above.epsilon_central(N, DELTA) > 1.0  # within 1 % of the largest (search tolerance 0.2 %)
    assert option.messages_per_client > 1


def test_cli_json_and_windows(capsys: pytest.CaptureFixture) -> None:
    code = main(["plan", "--kind", "histogram", "--d", str(D), "--n", str(N), "--delta", str(DELTA),
                 "--epsilon-central", "0.8", "--mechanism", "oue", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["kind"] == "histogram" and out["recommended"] == "oue"
    assert [o["mechanism"] for o in out["options"]] == ["oue"]
    code = main(["plan", "--kind", "histogram", "--d", str(D), "--n", str(N), "--delta", str(DELTA),
                 "--windows", "4", "--epsilon-central-total", "1.5", "--mechanism", "grr", "--json"])
    out = json.loads(capsys.readouterr().out)
    total = out["windows"]["per_mechanism"]["grr"]
    assert code == 0 and total["eps_central_total"] <= 1.5 and total["eps_central_window_target"] > 1.5 / 4
    code = main(["plan", "--kind", "histogram", "--d", str(D), "--n", str(N), "--delta", str(DELTA),
                 "--target-stderr", "0.02", "--mechanism", "grr"])
    text = capsys.readouterr().out
    assert code == 0 and "recommended      grr" in text and "per-item stderr 0.02" in text


@pytest.mark.parametrize(("extra", "reason"), [
    ([], "exactly one of"),
    (["--epsilon-central", "1", "--target-stderr", "0.01"], "exactly one of"),
    (["--epsilon-central", "1", "--s", "2"], "--s does not apply"),
    (["--epsilon-central", "1", "--mechanism", "collision"], "histogram mechanisms"),
    (["--target-stderr", "2"], "in (0, 1)"),
])
def test_bad_plans_exit_2(capsys: pytest.CaptureFixture, extra: list[str], reason: str) -> None:
    code = main(["plan", "--kind", "histogram", "--d", "8", "--n", "1000", "--delta", "1e-6", *extra])
    captured = capsys.readouterr()
    assert code == 2 and reason in captured.err, captured.err


def test_windows_compose_rappor_by_its_per_window_guarantee() -> None:
    """RAPPOR's replacement changes two channels: its window enters the composition as (eps_c, delta), never as
    one channel's shuffle PLD (which would understate it); single-report oracles by their PLD."""
    from transforms.planning.histogram import HistogramOption, HistogramPlan
    from transforms.planning.windows import _release

    def option(name: str) -> HistogramOption:
        return HistogramOption(mechanism=name, eps_local=3.0, eps_central=0.7, alpha=1 / (math.exp(3) + 1),
                               stderr=0.01, message_bits=3, messages_per_client=1.0, parameters={}, feasible=True)

    for name, approximate in (("rappor", True), ("oue", False)):
        plan = HistogramPlan(d=8, n=N, delta=DELTA, eps_central_target=0.7, target_stderr=None,
                             options=(option(name),), recommended=name)
        release = _release(plan, N, 1e-8)
        assert (release.approx_epsilon == 0.7) is approximate
        assert (release.mechanism_alpha is None) is approximate
