"""Exact LDP of GRR, OUE and OLH by enumeration (docs/mathematics.md §2.1-2.3), and a check that the
enumeration describes what ``encode`` really does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_encode_matches_table, assert_exact_ldp
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE

CASES = [
    *(GRR(d, eps) for d in (2, 3, 5) for eps in (0.5, 2.0)),
    *(OUE(d, eps) for d in (2, 3, 4) for eps in (0.5, 2.0)),
    OLH(4, 1.0, g=3, seed_family=8),
    OLH(4, 2.0, g=3, seed_family=8),
]
TIGHT = (GRR, OUE)  # alpha = max TV / (e^eps - 1) exactly; OLH only bounds it
EMPIRICAL = [GRR(3, 0.5), GRR(5, 2.0), OUE(3, 0.5), OUE(4, 2.0), OLH(4, 2.0, g=3, seed_family=8)]


def _ids(m: object) -> str:
    return repr(m)


def outcome_index(mech: GRR | OUE | OLH, reports: np.ndarray) -> np.ndarray:
    """Map reports to the enumeration order documented by ``exact_output_distribution``."""
    if isinstance(mech, GRR):
        return reports["value"]
    if isinstance(mech, OUE):  # bit j of the index = bit of item j
        bits = np.unpackbits(reports["bits"], axis=1, count=mech.d).astype(np.int64)
        return bits @ (1 << np.arange(mech.d))
    return reports["seed"].astype(np.int64) * mech.buckets + reports["z"]


def _table(mech: GRR | OUE | OLH) -> np.ndarray:
    return np.stack([mech.exact_output_distribution(x) for x in range(mech.d)])


@pytest.mark.parametrize("mech", CASES, ids=_ids)
def test_exact_ldp_ratio(mech: GRR | OUE | OLH) -> None:
    worst = assert_exact_ldp(_table(mech), mech.epsilon_local)
    assert worst == pytest.approx(math.exp(mech.epsilon_local), rel=1e-12)  # tight (OLH: some seed separates some pair)


@pytest.mark.parametrize("mech", CASES, ids=_ids)
def test_mixture_alpha_bounds_total_variation(mech: GRR | OUE | OLH) -> None:
    # docs/mathematics.md §1.2: alpha = max TV(R(x), R(x')) / (e^eps - 1) is a valid mixture parameter.
    table = _table(mech)
    tv = max(0.5 * np.abs(table[x] - table[x2]).sum() for x in range(mech.d) for x2 in range(mech.d))
    alpha = tv / math.expm1(mech.epsilon)
    assert alpha <= mech.mixture_alpha * (1 + 1e-12)
    assert (1 + math.exp(mech.epsilon)) * mech.mixture_alpha <= 1 + 1e-12
    if isinstance(mech, TIGHT):
        assert alpha == pytest.approx(mech.mixture_alpha, rel=1e-12)


@pytest.mark.parametrize("mech", EMPIRICAL, ids=_ids)
def test_enumeration_matches_encode(mech: GRR | OUE | OLH) -> None:
    assert_encode_matches_table(mech, _table(mech), outcome_index, draws=200_000, seed=1234)
