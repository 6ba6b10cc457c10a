"""The per-device, per-epoch budget: exhaustion, renewal, sharing across specs, and what each report costs."""

from __future__ import annotations

import json
import math

import pytest

from tests.device.helpers import DAY, T0, client_kwargs, histogram_spec
from transforms.device import Budget, BudgetExceeded, Client, StateError
from transforms.privacy.composition import fragment_epsilon
from transforms.spec import load_spec


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_budget_exhausts_refuses_with_reason_and_renews_at_the_epoch_boundary(tmp_path):
    clock = Clock(T0)
    client = Client(histogram_spec("grr", 1.0), tmp_path, budget=Budget(3.0), clock=clock, **client_kwargs())
    for _ in range(3):
        client.encode(1)
    assert client.status().spent == pytest.approx(3.0) and client.status().remaining == 0.0
    with pytest.raises(BudgetExceeded) as refused:
        client.encode(1)
    message = str(refused.value)
    assert "would cost epsilon 1" in message and "3 of the epoch's 3" in message
    assert "renews at 2025-11-25T00:00:00Z" in message and "began 2025-11-24T00:00:00Z" in message
    assert refused.value.cost == 1.0 and client.status().reports == 3  # nothing was spent by the refusal
    clock.now = math.floor(T0 / DAY) * DAY + DAY - 0.001  # last millisecond of the epoch: still refused
    with pytest.raises(BudgetExceeded):
        client.encode(2)
    clock.now += 0.001  # the next epoch starts: a full budget again
    client.encode(2)
    status = client.status()
    assert (status.spent, status.reports, status.epoch_start) == (1.0, 1, math.floor(T0 / DAY) * DAY + DAY)


def test_setting_the_clock_back_never_renews(tmp_path):
    clock = Clock(T0)
    client = Client(histogram_spec("grr", 2.0), tmp_path, budget=Budget(2.0), clock=clock, **client_kwargs())
    client.encode(0)
    clock.now = T0 - 30 * DAY
    with pytest.raises(BudgetExceeded):
        client.encode(0)


def test_one_budget_across_specs_and_client_objects(tmp_path):
    clock = Clock(T0)
    budget = Budget(5.0, epoch_seconds=3600)
    a = Client(histogram_spec("grr", 2.0, name="a"), tmp_path, budget=budget, clock=clock, **client_kwargs())
    b = Client(histogram_spec("olh", 2.0, name="b", d=16), tmp_path, budget=budget, clock=clock, **client_kwargs())
    a.encode(0)
    b.encode(7)
    assert a.device_id == b.device_id  # one device key per state directory
    with pytest.raises(BudgetExceeded):
        a.encode(1)  # 2 + 2 + 2 > 5, whichever spec asks
    assert b.status().spent == 4.0
    clock.now += 3600
    a.encode(1)


def test_out_of_domain_values_are_refused_and_cost_nothing(tmp_path):
    client = Client(histogram_spec("grr", 1.0), tmp_path, budget=Budget(3.0), clock=Clock(T0), **client_kwargs())
    for bad in (3, -1, "nope", 1.5, None):
        with pytest.raises(ValueError):
            client.encode(bad)
    assert client.status().reports == 0 and not (tmp_path / "budget.json").exists()


def test_fragments_of_a_memoized_backstop_cost_the_increment_of_eps_k_tau(tmp_path):
    clock = Clock(T0)
    spec = histogram_spec("rappor_fragments", 2.0, d=4, fragments=3)
    mech = spec.randomizer
    client = Client(spec, tmp_path, budget=Budget(2.0), clock=clock, **client_kwargs())
    costs = []
    for _ in range(6):
        costs.append(client.cost(2).epsilon)
        client.encode(2)
    eps = [fragment_epsilon(mech.epsilon_backstop, mech.eps_f, 3 * k) for k in range(7)]
    assert costs == pytest.approx([eps[k + 1] - eps[k] for k in range(6)], rel=1e-12)
    assert costs[0] == pytest.approx(mech.epsilon_local)  # one report alone: eps(tau), the mechanism's LDP
    assert client.status().spent == pytest.approx(eps[6], rel=1e-12) and eps[6] < mech.epsilon_backstop
    other = client.cost(1)
    assert other.epsilon == pytest.approx(eps[1]) and "report 1 of this value" in other.rule  # its own backstop
    clock.now += DAY
    assert client.cost(2).epsilon == pytest.approx(eps[1])  # a new epoch charges its own reports from scratch


def test_shuffle_only_protocols_are_charged_their_central_target(tmp_path):
    spec = load_spec("examples/app_language_multimessage.toml")
    assert math.isinf(spec.randomizer.epsilon_local)
    client = Client(spec, tmp_path, budget=Budget(100.0), clock=Clock(T0), **client_kwargs())
    cost = client.cost(spec.categories[0])
    assert cost.epsilon == spec.randomizer.epsilon and "central target" in cost.rule
    client.encode(spec.categories[0])
    assert client.status().spent == spec.randomizer.epsilon


def test_a_corrupt_ledger_stops_the_client_instead_of_resetting_the_budget(tmp_path):
    client = Client(histogram_spec("grr", 1.0), tmp_path, budget=Budget(3.0), clock=Clock(T0), **client_kwargs())
    client.encode(0)
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert ledger["spent"] == 1.0 and ledger["reports"] == 1
    (tmp_path / "budget.json").write_text('{"format": 1, "spent": ')
    with pytest.raises(StateError, match=r"budget\.json"):
        client.encode(0)


def test_budget_configuration_is_checked():
    for bad in (0, -1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError):
            Budget(bad)
    with pytest.raises(ValueError):
        Budget(1.0, epoch_seconds=0)


@pytest.mark.parametrize(("eps_b", "eps_f"), [(0.5, 0.1), (2.0, 1.0), (4.0, 3.3), (8.0, 0.5), (10.0, 15.0)])
def test_per_epoch_charges_of_one_backstop_bound_its_lifetime_loss(eps_b, eps_f):
    """Charges restart each epoch; their sum over epochs bounds eps(K tau) of all K reports (subadditivity)."""
    tau = 4
    for a in range(1, 12):
        for b in range(1, 12):
            together = fragment_epsilon(eps_b, eps_f, (a + b) * tau)
            apart = fragment_epsilon(eps_b, eps_f, a * tau) + fragment_epsilon(eps_b, eps_f, b * tau)
            assert together <= apart * (1 + 1e-12) and together <= eps_b * (1 + 1e-12)
