"""The accounting planner (docs/mathematics.md §1.2, §3, §4.1) and ``esa plan``: regression values in both
directions, maximality, monotonicity, [Collision]'s closed form (sanity example), [VecSum]'s rules,
CLI text / JSON / errors.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time

import pytest

from pipelines.cli import main
from transforms.planning.planner import KV_MECHANISMS, kv_alpha, plan_kv_mean, plan_vector_mean
from transforms.planning.search import FeasibilityOracle, largest_feasible_eps, minimise_int
from transforms.privacy.kv_formulas import collision_t_paper
from transforms.privacy.shuffle_bound import epsilon_central, hockey_stick

# Regression rows as (mechanism, d, s, t, eps_local, n, delta, eps_central). A k-RR row over k values is PCKV-GRR with
# s = 1 and 2(d + 1) = k; a generic row is PrivKV (generic alpha); the CoCo row reuses Collision's alpha. Every
# mechanism-specific alpha certifies the generic value (docs/mathematics.md §1.2), so each eps_central is the
# generic one at its (eps_local, n, delta).
SPEC_11_4 = [
    ("collision", 256, 4, 17, 1.0, 10**4, 1e-4, 0.025582),
    ("collision", 256, 4, 36, 2.0, 10**4, 1e-4, 0.073586),
    ("collision", 256, 16, 149, 2.0, 10**5, 1e-5, 0.026812),
    ("collision", 256, 64, 1412, 3.0, 10**5, 1e-5, 0.054104),
    ("collision", 256, 8, 451, 4.0, 10**6, 1e-6, 0.034280),
    ("coco", 256, 4, 36, 2.0, 10**4, 1e-4, 0.073586),
    ("pckv-grr", 4, 1, None, 2.0, 10**4, 1e-4, 0.073586),
    ("pckv-grr", 49, 1, None, 4.0, 10**5, 1e-6, 0.118153),
    ("privkv", 10, 2, None, 1.0, 10**4, 1e-4, 0.025582),
    ("privkv", 10, 2, None, 2.0, 10**4, 1e-4, 0.073586),
    ("privkv", 10, 2, None, 1.0, 10**5, 1e-5, 0.009677),
    ("privkv", 10, 2, None, 3.0, 10**5, 1e-5, 0.054104),
]


@pytest.mark.parametrize(("mechanism", "d", "s", "t", "eps", "n", "delta", "eps_c"), SPEC_11_4)
def test_plan_inverts_spec_11_4(mechanism, d, s, t, eps, n, delta, eps_c) -> None:
    plan = plan_kv_mean(mechanism, d, s, n, eps_c, delta, t=t)
    assert plan.eps_local == pytest.approx(eps, rel=1e-3)
    assert plan.t == t
    assert plan.eps_central == pytest.approx(eps_c, rel=1e-3)
    assert plan.eps_central <= eps_c * (1.0 + 1e-12)


@pytest.mark.parametrize("row", [row for row in SPEC_11_4 if row[0] == "collision"])
def test_paper_rule_recovers_spec_11_4_t(row) -> None:
    # The rows' t are [CoCo]'s floor(s e^eps + 2s - 1). The certified bound does not depend on t (§1.2), so the
    # feasible set is an interval in eps and the rule's t at the recovered eps is the row's t.
    mechanism, d, s, t, eps, n, delta, eps_c = row
    plan = plan_kv_mean(mechanism, d, s, n, eps_c, delta, t_rule="paper")
    assert plan.t == collision_t_paper(plan.eps_local, s)
    assert plan.t == t
    assert plan.eps_local == pytest.approx(eps, rel=1.5e-3)
    assert plan.eps_central <= eps_c * (1.0 + 1e-12)


SETTINGS = [
    (mechanism, rule)
    for mechanism in KV_MECHANISMS
    for rule in (("joint", "min-variance", "paper") if mechanism in ("collision", "coco") else ("joint",))
]


@pytest.mark.parametrize(("mechanism", "rule"), SETTINGS)
def test_plan_meets_target_and_is_maximal(mechanism: str, rule: str) -> None:
    d, s, n, target, delta = 64, 4, 20_000, 0.3, 1e-5
    plan = plan_kv_mean(mechanism, d, s, n, target, delta, t_rule=rule)
    # the tight bound at the plan, recomputed independently of the planner's feasibility oracle
    achieved = epsilon_central(n, plan.alpha, plan.eps_local, delta)
    assert achieved == pytest.approx(target, rel=1e-3)
    assert achieved <= target * (1.0 + 1e-12)
    assert hockey_stick(n, plan.alpha, plan.eps_local, target) <= delta  # exact O(n) sum, no window
    # maximal at its t: 0.1 % more local budget breaks the target
    bigger = plan.eps_local * 1.001
    assert epsilon_central(n, kv_alpha(mechanism, d, s, bigger, plan.t), bigger, delta) > target
    assert plan.alpha == kv_alpha(mechanism, d, s, plan.eps_local, plan.t)
    assert plan.mse_mean > 0 and plan.mse_frequency > 0


def test_joint_rule_is_no_worse_than_the_others() -> None:
    # "joint" searches (eps, t) together. The certified bound no longer depends on t (every Collision alpha
    # certifies the generic value, docs/mathematics.md §1.2), so it can only match the per-eps optimum, and must.
    args = ("collision", 100, 4, 10**4, 0.1, 1e-4)
    plans = {rule: plan_kv_mean(*args, t_rule=rule) for rule in ("joint", "min-variance", "paper")}
    assert plans["joint"].mse_mean <= min(plans["min-variance"].mse_mean, plans["paper"].mse_mean) * (1 + 1e-9)
    for rule in ("joint", "min-variance"):
        coco = plan_kv_mean("coco", 100, 4, 10**4, 0.1, 1e-4, t_rule=rule)
        assert coco.t % 2 == 0 and coco.t >= 10
    assert plans["joint"].eps_central == pytest.approx(0.1, rel=1e-3)


@pytest.mark.parametrize("mechanism", KV_MECHANISMS)
def test_plan_monotone_in_n_target_and_delta(mechanism: str) -> None:
    d, s = 32, 4
    base = plan_kv_mean(mechanism, d, s, 20_000, 0.3, 1e-5, t_rule="min-variance")
    more_users = plan_kv_mean(mechanism, d, s, 80_000, 0.3, 1e-5, t_rule="min-variance")
    looser = plan_kv_mean(mechanism, d, s, 20_000, 0.6, 1e-5, t_rule="min-variance")
    larger_delta = plan_kv_mean(mechanism, d, s, 20_000, 0.3, 1e-3, t_rule="min-variance")
    for other in (more_users, looser, larger_delta):
        assert other.eps_local > base.eps_local
        assert other.mse_mean < base.mse_mean


@pytest.mark.parametrize("mechanism", KV_MECHANISMS)
def test_feasibility_is_monotone_in_eps_local(mechanism: str) -> None:
    # The bisection's maximality assumes it: on a grid the divergence at the target never decreases with eps.
    d, s, n, target = 64, 4, 20_000, 0.3
    t = 40 if mechanism in ("collision", "coco") else None
    values = [hockey_stick(n, kv_alpha(mechanism, d, s, eps, t), eps, target)  # exact sum: no window mass
              for eps in (0.5 + 0.25 * k for k in range(24))]
    assert all(b >= a * (1 - 1e-9) - 1e-300 for a, b in itertools.pairwise(values))  # subnormals
    assert values[0] < 1e-5 < values[-1]


def test_search_is_sound_for_a_non_monotone_predicate() -> None:
    feasible = lambda eps: eps <= 1.0 or 2.0 <= eps <= 3.0  # noqa: E731
    search = largest_feasible_eps(feasible, 0.1)
    assert feasible(search.eps)
    assert not search.monotone
    assert search.eps == pytest.approx(1.0, rel=1e-8)  # restarted below the first failing grid point


def test_minimise_int_finds_the_integer_minimum() -> None:
    for centre, lower in ((0.2, 0), (3.7, 2), (137.4, 5), (9876.6, 11)):
        calls: list[int] = []

        def g(x: int, c: float = centre, seen: list[int] = calls) -> float:
            seen.append(x)
            return (x - c) ** 2

        expected = min(range(lower, math.ceil(centre) + 2), key=lambda x, c=centre: (x - c) ** 2)
        assert minimise_int(g, lower) == expected
        assert len(set(calls)) < 60


def test_feasibility_oracle_counts_and_short_circuits() -> None:
    oracle = FeasibilityOracle(1000, 0.5, 1e-6)
    assert oracle(0.1, 0.4) and oracle.evaluations == 0  # eps_local <= target: shuffling never hurts
    assert not oracle(0.005, 5.0) and oracle.evaluations == 1


def test_000_closed_form_sanity_example() -> None:
    # §3.1: n = 1e5, eps_c = 0.5, delta = 1/n, s = 16 -> Omega ~ 146.3, t ~ 65.7, eps ~ 1.80
    n, s, d = 10**5, 16, 256
    form = plan_kv_mean("collision", d, s, n, 0.5, 1.0 / n, t_rule="min-variance").closed_form
    assert form["valid"] and form["reason"] is None
    assert form["omega"] == pytest.approx(146.3, abs=0.05)
    assert form["t"] == pytest.approx(65.7, abs=0.05)
    assert form["eps_local"] == pytest.approx(1.80, abs=0.005)
    # [Collision] §5's variance at fixed Omega ([P*], squared denominator), typed independently
    omega, t = form["omega"], form["t"]
    top = (2 * d - s) * (t - 1) / t**2 + (omega + s - t) * (omega * (s - 1) - s + t) / (omega**2 * s)
    assert form["mse_frequency"] == pytest.approx(top / ((omega + s - t) / (omega * s) - 1 / t) ** 2 / n, rel=1e-12)
    # the blanket is very conservative: its parameters are certified by the tight bound far below the target
    assert form["tight_eps_central"] < 0.1


@pytest.mark.parametrize(
    ("mechanism", "n", "target", "reason"),
    [
        ("collision", 10**5, 1.5, "eps_c <= 1"),
        ("collision", 10**4, 0.1, "too small for s = 4"),
        ("coco", 10**4, 0.1, "too small for CoCo"),
        ("pckv-grr", 10**5, 0.5, "need Omega > 2d'"),
        ("pckv-ue", 10**5, 0.5, "k-RR-type randomizers only"),
        ("privkv", 10**5, 0.5, "k-RR-type randomizers only"),
    ],
)
def test_closed_form_refusals(mechanism: str, n: int, target: float, reason: str) -> None:
    form = plan_kv_mean(mechanism, 100, 4, n, target, 1e-5, t_rule="paper").closed_form
    assert not form["valid"] and reason in form["reason"]
    assert form["eps_local"] is None


def test_closed_forms_for_coco_and_pckv_grr_are_certified() -> None:
    for mechanism in ("coco", "pckv-grr"):
        plan = plan_kv_mean(mechanism, 20, 2, 10**6, 0.5, 1e-6)
        form = plan.closed_form
        assert form["valid"], form["reason"]
        assert form["eps_local"] < plan.eps_local  # the blanket certifies less local budget
        assert form["tight_eps_central"] < 0.5
        assert form["mse_mean"] > plan.mse_mean


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mechanism": "foo"}, "mechanism must be one of"),
        ({"s": 300}, "s .* must be <= d"),
        ({"epsilon_central": 0.0}, "epsilon_central must be > 0"),
        ({"delta": 1.0}, r"delta must lie in \(0, 1\)"),
        ({"n": 1}, "n must be an integer >= 2"),
        ({"t": 4}, "t must be an integer >= 5"),
        ({"mechanism": "coco", "t": 21}, "CoCo needs an even t"),
        ({"mechanism": "coco", "t": 8}, "t must be an integer >= 10"),
        ({"mechanism": "privkv", "t": 40}, "privkv has no output size t"),
        ({"t_rule": "best"}, "t_rule must be one of"),
    ],
)
def test_plan_kv_mean_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    arguments = {"mechanism": "collision", "d": 256, "s": 4, "n": 10**4, "epsilon_central": 0.5, "delta": 1e-5}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        plan_kv_mean(**arguments)


def test_plans_for_a_million_users_are_fast() -> None:
    timings = {}
    for rule in ("min-variance", "joint"):
        start = time.perf_counter()
        plan = plan_kv_mean("collision", 1024, 16, 10**6, 0.3, 1e-6, t_rule=rule)
        timings[rule] = time.perf_counter() - start
        assert plan.eps_central == pytest.approx(0.3, rel=1e-3)
    print(f"plan_kv_mean n=1e6: {timings}")
    assert timings["min-variance"] < 2.0  # one bisection (~45 windowed divergences) + the final epsilon_central
    assert timings["joint"] < 6.0


# --- vector_mean ([VecSum], docs/mathematics.md §4.1) -------------------------------------------------------


def test_vector_plan_reproduces_002_rules() -> None:
    plan = plan_vector_mean(100, 50_000, 0.95, 0.5, k_round=3)
    assert plan.gamma == pytest.approx(0.170530, abs=1e-6)
    assert plan.closed_form["k_star"] == pytest.approx(2.0643, abs=1e-4)
    assert plan.closed_form["normalized_mse_bound"] == pytest.approx(0.0341087, rel=1e-5)
    assert plan.eps_local_message == pytest.approx(math.log(1 + 4 * (1 - plan.gamma) / plan.gamma), rel=1e-12)
    assert plan.alpha == pytest.approx(plan.gamma / 4, rel=1e-12)
    assert plan.eps_central <= 0.95
    assert plan_vector_mean(100, 50_000, 0.95, 0.5).k_round == 2  # k* = 2.06 rounded
    two = plan_vector_mean(100, 50_000, 0.95, 0.5, k_round=3, t=2)
    assert two.gamma == pytest.approx(0.536628, abs=1e-6)
    assert two.eps_local_user == pytest.approx(2 * two.eps_local_message)
    assert two.alpha == pytest.approx(1 / (math.exp(two.eps_local_user) + 1), rel=1e-12)  # generic, t reports
    assert two.eps_central == epsilon_central(50_000, two.alpha, two.eps_local_user, 0.5)


def test_vector_plan_refuses_infeasible_with_what_to_raise() -> None:
    with pytest.raises(ValueError, match=r"gamma = 4\.10.*raise n to at least 205064"):
        plan_vector_mean(100, 50_000, 0.5, 1e-5, k_round=3)
    with pytest.raises(ValueError, match="eps_c < 6"):
        plan_vector_mean(100, 50_000, 6.5, 1e-5, k_round=3)
    # exactly at the advertised n the rule becomes feasible
    assert plan_vector_mean(100, 205_064, 0.5, 1e-5, k_round=3).gamma < 1.0


def test_vector_tight_accountant_meets_the_target_where_002_cannot() -> None:
    plan = plan_vector_mean(100, 50_000, 0.5, 1e-5, accountant="tight")
    assert not plan.closed_form["valid"]
    assert plan.eps_central == pytest.approx(0.5, rel=1e-3)
    assert plan.eps_central <= 0.5
    assert 0.0 < plan.gamma < 1.0 and plan.k_round >= 1
    fixed = plan_vector_mean(100, 50_000, 0.5, 1e-5, k_round=plan.k_round, accountant="tight")
    assert fixed.gamma == pytest.approx(plan.gamma, rel=1e-6)
    coarser = plan_vector_mean(100, 50_000, 0.5, 1e-5, k_round=1, accountant="tight")
    assert coarser.mse_mean_noise > plan.mse_mean_noise
    two = plan_vector_mean(100, 50_000, 0.5, 1e-5, k_round=plan.k_round, t=2, accountant="tight")
    assert two.eps_central == pytest.approx(0.5, rel=1e-3) and two.eps_central <= 0.5
    assert two.eps_local_user == pytest.approx(2 * two.eps_local_message)
    assert two.gamma > plan.gamma  # the generic alpha of two reports certifies less per report


# --- esa plan ---------------------------------------------------------------------------------------------

KV_ARGS = ["plan", "--kind", "kv_mean", "--mechanism", "collision", "--d", "256", "--s", "16", "--n", "100000",
           "--epsilon-central", "0.5", "--delta", "1e-5"]


def test_cli_kv_text(capsys) -> None:
    assert main([*KV_ARGS, "--t-rule", "min-variance"]) == 0
    out = capsys.readouterr().out
    assert "kv_mean with collision" in out
    assert "output size t" in out and "[min-variance]" in out
    assert "[Collision] blanket" in out and "omega 146.296" in out


def test_cli_kv_json(capsys) -> None:
    assert main([*KV_ARGS, "--t", "3000", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kind"] == "kv_mean" and plan["mechanism"] == "collision" and plan["t"] == 3000
    assert plan["t_rule"] == "fixed"
    assert plan["eps_central"] == pytest.approx(0.5, rel=1e-3)
    assert plan == plan_kv_mean("collision", 256, 16, 10**5, 0.5, 1e-5, t=3000).to_dict() | {
        "divergence_evaluations": plan["divergence_evaluations"]}


def test_cli_vector_text_and_json(capsys) -> None:
    args = ["plan", "--kind", "vector_mean", "--d", "100", "--n", "50000", "--epsilon-central", "0.95",
            "--delta", "0.5", "--k-round", "3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vector_mean ([VecSum])" in out and "gamma            0.17053" in out
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kind"] == "vector_mean" and plan["k_round"] == 3 and plan["accountant"] == "002"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "vector_mean", "--d", "100", "--n", "50000", "--epsilon-central", "0.5", "--delta", "1e-5",
          "--k-round", "3"], "raise n to at least 205064"),
        (["--kind", "kv_mean", "--mechanism", "foo", "--d", "10", "--s", "2", "--n", "1000", "--epsilon-central",
          "0.5", "--delta", "1e-5"], "mechanism must be one of"),
        (["--kind", "kv_mean", "--mechanism", "coco", "--d", "10", "--n", "1000", "--epsilon-central", "0.5",
          "--delta", "1e-5"], "needs --mechanism and --s"),
        (["--kind", "kv_mean", "--mechanism", "pckv-ue", "--d", "10", "--s", "2", "--n", "1000",
          "--epsilon-central", "0.5", "--delta", "1e-5", "--t", "9"], "has no output size t"),
        (["--kind", "vector_mean", "--mechanism", "coco", "--d", "10", "--n", "1000", "--epsilon-central", "0.5",
          "--delta", "1e-5"], "takes no --mechanism"),
        (["--kind", "kv_mean", "--mechanism", "coco", "--d", "10", "--s", "2", "--n", "1000",
          "--epsilon-central", "0.5", "--delta", "2"], r"delta must lie in \(0, 1\)"),
    ],
)
def test_cli_errors_exit_2(capsys, args: list[str], message: str) -> None:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("esa plan: error: ")
    assert re.search(message, err)
