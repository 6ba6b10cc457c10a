"""Every frequency-oracle randomizer audited against its claimed local epsilon, and a broken twin refuted.

For each mechanism: inputs x0 = 0, x1 = 1, N encodings each, the event "the report points at x0 and not at
x1" (the likelihood-ratio-maximising event, whose exact ratio is e^eps for every oracle here). The audit's
lower bound must stay <= the claimed epsilon_local (replacement LDP). The *same* audit applied to the same
mechanism built with the flip probabilities of twice the epsilon, but held to the original claim, must exceed
it: the audit can fail. Fixed seeds; Clopper-Pearson at 1 - 1e-3.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tests.audit.ldp_audit import epsilon_lower_bound
from transforms.mechanisms.base import replacement_local_epsilon
from transforms.mechanisms.frequency.count_mean_sketch import CountMeanSketch
from transforms.mechanisms.frequency.hadamard import HadamardResponse, _in_support
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor
from transforms.mechanisms.hashing import hash_to_buckets
from transforms.mechanisms.randomness import seeded_rng

N = 60_000


def _grr(mech, reports, x0, x1):
    return reports["value"] == x0


def _oue(mech, reports, x0, x1):
    bits = np.unpackbits(reports["bits"], axis=1)
    return (bits[:, x0] == 1) & (bits[:, x1] == 0)


def _olh(mech, reports, x0, x1):
    seed = reports["seed"].astype(np.uint64)
    h0, h1 = hash_to_buckets(seed, np.full(seed.shape, x0), mech.buckets), hash_to_buckets(
        seed, np.full(seed.shape, x1), mech.buckets)
    return (reports["z"] == h0) & (reports["z"] != h1)


def _hadamard(mech, reports, x0, x1):
    y = reports["value"]
    return _in_support(np.int64(x0 + 1), y) & ~_in_support(np.int64(x1 + 1), y)


def _cms(mech, reports, x0, x1):
    bits = np.unpackbits(reports["bits"], axis=1)
    row, idx = reports["row"], np.arange(len(reports))
    c0, c1 = mech.hash(row, np.full(row.shape, x0)), mech.hash(row, np.full(row.shape, x1))
    return (bits[idx, c0] == 1) & (bits[idx, c1] == 0) & (c0 != c1)


def _rappor(mech, encoded, x0, x1):
    reports, owner = encoded
    n = int(owner.max()) + 1 if owner.size else 0
    has0 = np.bincount(owner[reports["channel"] == x0], minlength=n) > 0
    has1 = np.bincount(owner[reports["channel"] == x1], minlength=n) > 0
    return has0 & ~has1


CASES: list[tuple[Callable[[float], object], float, Callable, str]] = [
    (lambda e: GRR(8, e), 1.0, _grr, "grr"),
    (lambda e: OUE(16, e), 1.0, _oue, "oue"),
    (lambda e: OLH(16, e, seed_family=4096), 1.0, _olh, "olh"),
    (lambda e: HadamardResponse(16, e), 1.0, _hadamard, "hadamard"),
    (lambda e: CountMeanSketch(16, e, k=16, m=32), 2.0, _cms, "cms"),
    (lambda e: AttributeFragmentedRappor(8, e), 0.5, _rappor, "rappor"),
]


def _claim(mech) -> float:
    """Replacement LDP: rappor's budget is removal, its replacement claim 2 eps (two bits change)."""
    return replacement_local_epsilon(mech)


def _audit(mech, event: Callable, seed: int) -> float:
    rng = seeded_rng(seed)
    hits = []
    for x in (0, 1):
        values = np.full(N, x, dtype=np.int64)
        encoded = mech.encode_messages(values, rng) if hasattr(mech, "encode_messages") else mech.encode(values, rng)
        hits.append(int(np.sum(event(mech, encoded, 0, 1))))
    return epsilon_lower_bound(hits[0], N, hits[1], N)


@pytest.mark.parametrize(("build", "eps", "event", "name"), CASES, ids=[c[3] for c in CASES])
def test_audit_respects_claim_and_refutes_broken_twin(build, eps: float, event, name: str) -> None:
    honest = build(eps)
    claim = _claim(honest)
    lower = _audit(honest, event, seed=11)
    assert lower <= claim, f"{name}: audited eps >= {lower:.3f} exceeds the claimed {claim:g}"
    assert lower > 0.8 * claim, f"{name}: the event is too weak to audit ({lower:.3f} vs {claim:g})"
    broken = build(2.0 * eps)  # flips of a larger epsilon, still claimed at eps
    refuted = _audit(broken, event, seed=12)
    assert refuted > claim, f"{name}: audit failed to refute a 2x epsilon ({refuted:.3f} <= {claim:g})"
