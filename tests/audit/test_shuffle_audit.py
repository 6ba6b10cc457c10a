"""Audit of a shuffled crowd against its claimed central epsilon (and of an unshuffled one, which must fail).

A crowd of n = 15 k-RR reports (d = 4, eps0 = 2): neighbouring datasets differ in one report (the victim
holds 0 or 1; the other 14 hold 2). The analyst sees the shuffled multiset; the test statistic is the count of
category 0 and the event "count >= t", with t chosen on the *exact* binomial laws (not on the samples) to
maximise the ratio. The Clopper-Pearson lower bound (delta subtracted, ``ldp_audit``) must stay below the
tight bound ``epsilon_central`` the ledger publishes, and at least two windows' worth of reports must stay
below the odometer's composed value too. Without the shuffle (the victim's own report visible) the same
audit must refute the claim. The count is permutation invariant, so this audits the accountant, not the
Beam shuffler (whose anonymity is tested in tests/transforms).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from tests.audit.ldp_audit import epsilon_lower_bound
from transforms.mechanisms.frequency.oracles import GRR
from transforms.mechanisms.randomness import seeded_rng
from transforms.privacy.mixture import alpha_grr
from transforms.privacy.odometer import WindowRelease, cumulative_epsilon
from transforms.privacy.shuffle_bound import epsilon_central

D, EPS0, N_CLIENTS, DELTA, TRIALS = 4, 2.0, 15, 1e-3, 300_000


def _counts(victim: int, windows: int, rng) -> np.ndarray:
    """Count of category 0 in the shuffled output, summed over ``windows`` windows, per trial."""
    mech = GRR(D, EPS0)
    values = np.full(N_CLIENTS, 2, dtype=np.int64)
    values[0] = victim
    total = np.zeros(TRIALS, dtype=np.int64)
    for _ in range(windows):
        reports = mech.encode(np.tile(values, TRIALS), rng)["value"].reshape(TRIALS, N_CLIENTS)
        shuffled = rng.permuted(reports, axis=1)  # the analyst's view: a random order
        total += np.sum(shuffled == 0, axis=1)
    return total


def _threshold(windows: int) -> int:
    """The t maximising (P0[count >= t] - delta) / P1[count >= t] on the exact laws, with P1 >= 1e-3."""
    p, q = math.exp(EPS0) / (math.exp(EPS0) + D - 1), 1.0 / (math.exp(EPS0) + D - 1)
    others = binom.pmf(np.arange(windows * (N_CLIENTS - 1) + 1), windows * (N_CLIENTS - 1), q)
    victim0 = binom.pmf(np.arange(windows + 1), windows, p)
    victim1 = binom.pmf(np.arange(windows + 1), windows, q)
    law0, law1 = np.convolve(others, victim0), np.convolve(others, victim1)
    tail0, tail1 = law0[::-1].cumsum()[::-1], law1[::-1].cumsum()[::-1]
    ratio = np.where(tail1 >= 1e-3, (tail0 - DELTA) / np.maximum(tail1, 1e-300), 0.0)
    return int(np.argmax(ratio))


def test_shuffled_crowd_stays_below_claimed_central_epsilon() -> None:
    claim = epsilon_central(N_CLIENTS, alpha_grr(EPS0, D), EPS0, DELTA)
    assert claim < EPS0  # amplification is claimed, so there is something to audit
    rng = seeded_rng(21)
    t = _threshold(1)
    hits = [int(np.sum(_counts(v, 1, rng) >= t)) for v in (0, 1)]
    lower = epsilon_lower_bound(hits[0], TRIALS, hits[1], TRIALS, delta=DELTA)
    assert 0.0 < lower <= claim, f"audited {lower:.3f} vs claimed {claim:.3f}"


def test_two_windows_stay_below_the_odometer() -> None:
    claim = cumulative_epsilon([WindowRelease(alpha_grr(EPS0, D), EPS0, N_CLIENTS)] * 2, DELTA)
    rng = seeded_rng(22)
    t = _threshold(2)
    hits = [int(np.sum(_counts(v, 2, rng) >= t)) for v in (0, 1)]
    lower = epsilon_lower_bound(hits[0], TRIALS, hits[1], TRIALS, delta=DELTA)
    assert 0.0 < lower <= claim, f"audited {lower:.3f} vs composed claim {claim:.3f}"


def test_unshuffled_crowd_is_refuted() -> None:
    claim = epsilon_central(N_CLIENTS, alpha_grr(EPS0, D), EPS0, DELTA)
    rng = seeded_rng(23)
    mech = GRR(D, EPS0)
    hits = []
    for victim in (0, 1):
        values = np.full(N_CLIENTS, 2, dtype=np.int64)
        values[0] = victim
        reports = mech.encode(np.tile(values, TRIALS), rng)["value"].reshape(TRIALS, N_CLIENTS)
        hits.append(int(np.sum(reports[:, 0] == 0)))  # no shuffle: the victim's report is identifiable
    lower = epsilon_lower_bound(hits[0], TRIALS, hits[1], TRIALS, delta=DELTA)
    assert lower > claim, f"audit failed to refute an unshuffled release ({lower:.3f} <= {claim:.3f})"
