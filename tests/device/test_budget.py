"""The per-device, per-epoch budget: exhaustion, renewal, sharing across specs, and what each report costs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.device.helpers import DAY, T0, client_kwargs, histogram_spec
from transforms.device import Budget, BudgetConflict, BudgetExceeded, Client, StateError, change_budget, stored_budget
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


def test_fragments_of_a_memoized_backstop_cost_the_replacement_increment_of_eps_k_tau(tmp_path):
    """Replacement changes two bits of the one-hot vector: each report costs 2 (eps(k tau) - eps((k-1) tau))."""
    clock = Clock(T0)
    spec = histogram_spec("rappor_fragments", 2.0, d=4, fragments=3)
    mech = spec.randomizer
    client = Client(spec, tmp_path, budget=Budget(4.0), clock=clock, **client_kwargs())
    costs = []
    for _ in range(6):
        costs.append(client.cost(2).epsilon)
        client.encode(2)
    eps = [fragment_epsilon(mech.epsilon_backstop, mech.eps_f, 3 * k) for k in range(7)]
    assert costs == pytest.approx([2 * (eps[k + 1] - eps[k]) for k in range(6)], rel=1e-12)
    assert costs[0] == pytest.approx(mech.epsilon_replacement)  # one report alone: its replacement LDP
    assert client.status().spent == pytest.approx(2 * eps[6], rel=1e-12) and eps[6] < mech.epsilon_backstop
    other = client.cost(1)
    assert other.epsilon == pytest.approx(2 * eps[1]) and "report 1 of this value" in other.rule  # its own backstop
    clock.now += DAY
    assert client.cost(2).epsilon == pytest.approx(2 * eps[1])  # a new epoch charges its own reports from scratch


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


# -- one budget per device (issue 23, item 5) --------------------------------------------------------------


def _try_clients(state_dir, specs_and_budgets, clock):
    """Construct each client; a refused one (``BudgetConflict``) is recorded and left out."""
    clients, refusals = [], []
    for spec, budget in specs_and_budgets:
        try:
            clients.append(Client(spec, state_dir, budget=budget, clock=clock, **client_kwargs()))
        except BudgetConflict as refused:
            refusals.append(str(refused))
    return clients, refusals


def _report(client, value, produced):
    """Report once; add the epsilon of a report that left the client to ``produced`` (grr: its epsilon, the
    replacement LDP -- independent of the client's own accounting, which is what is under test)."""
    try:
        client.encode(value)
    except BudgetExceeded:
        return
    assert client.spec.mechanism == "grr"
    produced.append(client.spec.epsilon)


def test_clients_with_another_limit_or_none_cannot_spend_past_the_devices_budget(tmp_path):
    """The issue's case: Budget(4), Budget(100) and no budget on one state directory spent epsilon 12 against 4
    (each client two grr reports of epsilon 2). Now the device has one budget and the other two are refused."""
    clock = Clock(T0)
    spec = histogram_spec("grr", 2.0)
    clients, refusals = _try_clients(tmp_path, [(spec, Budget(4.0)), (spec, Budget(100.0)), (spec, None)], clock)
    produced: list[float] = []
    for client in clients:
        for _ in range(2):
            _report(client, 1, produced)
    assert sum(produced) == 4.0 and len(produced) == 2
    assert len(refusals) == 2
    assert "Budget(epsilon_per_epoch=4, epoch_seconds=86400)" in refusals[0] and "epsilon_per_epoch=100" in refusals[0]
    assert "given no budget" in refusals[1] and "stored_budget" in refusals[1]
    assert stored_budget(tmp_path) == Budget(4.0)
    inherited = Client(spec, tmp_path, budget=stored_budget(tmp_path), clock=clock, **client_kwargs())
    with pytest.raises(BudgetExceeded):
        inherited.encode(0)


def test_an_unbudgeted_client_opened_first_is_refused_once_the_device_has_a_budget(tmp_path):
    clock = Clock(T0)
    spec = histogram_spec("grr", 2.0)
    free = Client(spec, tmp_path, clock=clock, **client_kwargs())
    free.encode(0)  # no budget anywhere yet: allowed, and nothing is recorded
    assert not (tmp_path / "budget.json").exists() and stored_budget(tmp_path) is None
    Client(spec, tmp_path, budget=Budget(4.0), clock=clock, **client_kwargs())  # the device gets its budget
    with pytest.raises(BudgetConflict, match="no budget"):
        free.encode(0)


def test_a_daily_and_an_hourly_client_share_one_budget(tmp_path):
    """The issue's case: a daily and an hourly client on one device made 48 reports (epsilon 96) in 24 h against
    a daily limit of 4, because each reset the shared ledger to its own epoch. Now an hourly budget on a daily
    device is refused, and the hourly spec's client, given the device's budget, shares the day's epsilon 4."""
    day_start = math.floor(T0 / DAY) * DAY
    clock = Clock(day_start)
    daily_spec = histogram_spec("grr", 2.0, name="daily", window_seconds=86400)
    hourly_spec = histogram_spec("grr", 2.0, name="hourly", window_seconds=3600)
    clients, refusals = _try_clients(tmp_path, [(daily_spec, Budget(4.0, 86400)), (hourly_spec, Budget(4.0, 3600))],
                                     clock)
    clients += _try_clients(tmp_path, [(hourly_spec, stored_budget(tmp_path))], clock)[0]
    produced: list[float] = []
    for hour in range(24):
        clock.now = day_start + hour * 3600 + 60
        for client in reversed(clients):  # the hourly client first, as in the run
            _report(client, hour % 3, produced)
    assert sum(produced) == 4.0 and len(produced) == 2
    assert len(refusals) == 1 and "epoch_seconds=3600" in refusals[0] and len(clients) == 2


def test_every_charge_is_replacement_epsilon_checked_against_the_exact_output_laws(tmp_path):
    """grr, rappor (removal eps 2) and rappor_fragments on one budget: each report is charged its replacement LDP
    epsilon, which is computed here independently as the largest log-ratio of the exact output laws of two
    values (the issue's case charged removal for rappor next to replacement for grr: 8 charged, 12 spent)."""
    clock = Clock(T0)
    specs = [histogram_spec("grr", 2.0, name="g"), histogram_spec("rappor", 2.0, name="r"),
             histogram_spec("rappor_fragments", 2.0, name="f", fragments=2)]
    budget = Budget(100.0)
    for spec in specs:
        law = [spec.randomizer.exact_output_distribution(v) for v in range(spec.d)]
        exact = max(float(np.max(np.log(law[a] / law[b]))) for a in range(spec.d) for b in range(spec.d) if a != b)
        client = Client(spec, tmp_path, budget=budget, clock=clock, **client_kwargs())
        before = client.status().spent
        assert client.cost(1).epsilon == pytest.approx(exact, rel=1e-9), spec.mechanism
        client.encode(1)
        assert client.status().spent - before == pytest.approx(exact, rel=1e-9)


def test_a_looser_budget_takes_effect_when_the_current_epoch_ends(tmp_path):
    """An app update raising the limit mid-epoch must not give the epoch a second, looser limit: the epoch
    that spent 4 of 4 stays closed, new clients with the new budget are accepted at once, and from midnight
    the new limit is the only one."""
    clock = Clock(T0)
    spec = histogram_spec("grr", 2.0)
    old = Client(spec, tmp_path, budget=Budget(4.0), clock=clock, **client_kwargs())
    old.encode(0)
    old.encode(1)
    midnight = math.floor(T0 / DAY) * DAY + DAY
    assert change_budget(tmp_path, Budget(8.0), now=T0) == midnight
    assert stored_budget(tmp_path, now=T0) == Budget(4.0) and stored_budget(tmp_path, now=midnight) == Budget(8.0)
    new = Client(spec, tmp_path, budget=Budget(8.0), clock=clock, **client_kwargs())
    with pytest.raises(BudgetExceeded):
        new.encode(2)  # accounted under the limit in force: 4
    assert new.status().limit == 4.0 and new.status().spent == 4.0
    clock.now = midnight
    for _ in range(4):
        new.encode(2)
    with pytest.raises(BudgetExceeded):
        new.encode(2)
    assert new.status().spent == 8.0 and new.status().limit == 8.0
    with pytest.raises(BudgetConflict, match="epsilon_per_epoch=8"):
        old.encode(0)  # the old budget is gone once the new one is in force
    with pytest.raises(BudgetConflict):
        Client(spec, tmp_path, budget=Budget(4.0), clock=clock, **client_kwargs())


def test_a_tighter_budget_applies_at_once_and_an_epoch_change_waits(tmp_path):
    clock = Clock(T0)
    spec = histogram_spec("grr", 1.0)
    client = Client(spec, tmp_path, budget=Budget(4.0), clock=clock, **client_kwargs())
    for _ in range(3):
        client.encode(0)
    assert change_budget(tmp_path, Budget(2.0), now=T0) == int(T0)  # tighter: the 3 spent already exceed it
    client = Client(spec, tmp_path, budget=Budget(2.0), clock=clock, **client_kwargs())
    with pytest.raises(BudgetExceeded):
        client.encode(0)
    midnight = math.floor(T0 / DAY) * DAY + DAY
    assert change_budget(tmp_path, Budget(2.0, epoch_seconds=3600), now=T0) == midnight  # another epoch: waits
    hourly = Client(spec, tmp_path, budget=Budget(2.0, epoch_seconds=3600), clock=clock, **client_kwargs())
    clock.now = T0 + 3600
    with pytest.raises(BudgetExceeded):
        hourly.encode(0)  # still the day's ledger: an hour later renews nothing
    clock.now = midnight + 60
    hourly.encode(0)
    hourly.encode(0)
    assert hourly.status().renews_at == midnight + 3600


def test_changing_the_budget_of_an_unused_device_applies_at_once(tmp_path):
    assert change_budget(tmp_path, Budget(3.0), now=T0) == int(T0)
    assert stored_budget(tmp_path, now=T0) == Budget(3.0)
    with pytest.raises(BudgetConflict, match="no budget"):
        Client(histogram_spec("grr", 1.0), tmp_path, clock=Clock(T0), **client_kwargs())
    assert change_budget(tmp_path, Budget(6.0, epoch_seconds=3600), now=T0) == int(T0)  # nothing reported yet
    assert stored_budget(tmp_path, now=T0) == Budget(6.0, epoch_seconds=3600)
