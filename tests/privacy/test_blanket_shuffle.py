"""The per-mechanism (blanket pair) shuffle bound: declared decompositions checked, published numbers never optimistic.

1. Every ``blanket_decomposition()`` a product randomizer declares is checked against its exact output table:
   for every input pair a linear program must find the laws A, B, L, the common part M and the scale t of the
   ``BlanketDecomposition`` contract (docs/mathematics.md §1.2), and gamma may not exceed the mass common to all
   inputs, sum_y min_x P(y|x). A mutant declaring more common mass fails both.
2. The published central epsilon (the smaller of the generic and the blanket pair, ``best_epsilon``) and the
   blanket PLD the odometer composes are never below the exact epsilon of small shuffled crowds, computed here
   without any of the bound's code: k-RR through the exact law of the released histogram's sufficient counts
   (d in {2, 3, 4, 8}, eps0 in {1, 2, 3}, n up to 30, delta in {1e-3, 1e-6}); OUE, OLH and Hadamard through the
   full-histogram enumerator of ``shuffle_enumeration``.
3. Never below one neighbouring pair's exact divergence at n = 1,000 and 50,000 (a lower bound on the truth).

Tolerances: exact values are lower ends of 100-step bisections; 1e-9 in epsilon is far above their float error.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.special import gammaln

from tests.privacy.shuffle_enumeration import exact_epsilon
from tests.privacy.test_shuffle_exact import CASES as ENUMERATED_CASES
from tests.privacy.test_shuffle_exact import worst_exact_epsilon
from transforms.mechanisms.frequency.hadamard import HadamardResponse
from transforms.mechanisms.frequency.olh import OLH
from transforms.mechanisms.frequency.oracles import GRR, OUE
from transforms.privacy.blanket_shuffle import (
    BOUND_BLANKET,
    BlanketDecomposition,
    best_epsilon,
    blanket_pld_fits,
    blanket_shuffle_pld,
    epsilon_blanket_shuffle,
)
from transforms.privacy.shuffle_pld import PLDTooLargeError

TOLERANCE = 1e-9


# ---- 1. the declared decompositions, by linear programming over the exact output table ----------------------

def decomposition_holds(table: np.ndarray, dec: BlanketDecomposition, i: int, j: int) -> bool:
    """Whether A, B, L (mass t each, i.e. t times laws), M >= 0 and t in (0, 1] exist with
    R_i = w1 A + w2 B + w0 L + M, R_j = w2 A + w1 B + w0 L + M and gamma ((clone/2)(A + B) + (1 - clone) L)
    <= t min_x R_x, the residuals re-checked by hand (a solver's tolerance cannot pass a wrong declaration)."""
    k = table.shape[1]
    common = table.min(axis=0)
    eye, zero = np.eye(k), np.zeros((k, k))
    rows = [np.hstack([dec.w1 * eye, dec.w2 * eye, dec.w0 * eye, eye, np.zeros((k, 1))]),
            np.hstack([dec.w2 * eye, dec.w1 * eye, dec.w0 * eye, eye, np.zeros((k, 1))])]
    for block in range(3):  # sum A = sum B = sum L = t
        row = np.zeros((1, 4 * k + 1))
        row[0, block * k:(block + 1) * k] = 1.0
        row[0, -1] = -1.0
        rows.append(row)
    a_eq = np.vstack(rows)
    b_eq = np.concatenate([table[i], table[j], np.zeros(3)])
    half = dec.gamma * dec.clone / 2.0
    a_ub = np.hstack([half * eye, half * eye, dec.gamma * (1.0 - dec.clone) * eye, zero, -common[:, None]])
    result = linprog(-np.eye(1, 4 * k + 1, 4 * k).ravel(), A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=b_eq,
                     bounds=[(0, None)] * (4 * k) + [(0, 1)], method="highs")
    if result.status != 0:
        return False
    z = np.maximum(result.x, 0.0)
    return (z[-1] > 0.0 and np.abs(a_eq @ z - b_eq).max() <= 1e-10
            and (a_ub @ z).max() <= 1e-10 * max(1.0, common.max()))


def _table(mechanism: object, inputs: list[int]) -> np.ndarray:
    return np.array([mechanism.exact_output_distribution(x) for x in inputs])  # type: ignore[attr-defined]


def _olh_pair_decomposition(mechanism: OLH, i: int, j: int) -> BlanketDecomposition:
    """OLH's declaration covers a pair with collision rate c as its own decomposition at c (blanket_olh with
    c_min = c_max = c) scaled by t: checked per pair, and the declared one checked to be the family's range."""
    from transforms.privacy.blanket_shuffle import blanket_olh

    table = mechanism.hash_table
    c = float(np.mean(table[:, i] == table[:, j]))
    dec = blanket_olh(mechanism.epsilon, mechanism.buckets, c, c)
    assert dec is not None
    return dec


DECLARED = [
    *[(f"grr d={d} eps={eps:g}", GRR(d, eps), list(range(d))) for d in (2, 3, 4, 8) for eps in (1.0, 2.0, 3.0)],
    *[(f"oue d={d} eps={eps:g}", OUE(d, eps), list(range(d))) for d in (2, 3, 4) for eps in (1.0, 2.0)],
    *[(f"hadamard d={d} eps={eps:g}", HadamardResponse(d, eps), list(range(d))) for d in (3, 5) for eps in (1.0, 2.0)],
]


@pytest.mark.parametrize(("label", "mechanism", "inputs"), DECLARED, ids=[c[0] for c in DECLARED])
def test_declared_decomposition_holds_for_every_input_pair(label: str, mechanism: object, inputs: list[int]) -> None:
    table = _table(mechanism, inputs)
    dec = mechanism.blanket_decomposition()  # type: ignore[attr-defined]
    assert dec.gamma <= table.min(axis=0).sum() + 1e-12, f"{label}: gamma above the common mass"
    for i, j in itertools.permutations(range(len(inputs)), 2):
        assert decomposition_holds(table, dec, i, j), f"{label}: no decomposition for inputs {i} -> {j}"


@pytest.mark.parametrize(("d", "g", "seeds"), [(3, 3, 4), (4, 4, 4), (2, 3, 3)])
def test_olh_decomposition_holds_for_every_pair_of_its_family(d: int, g: int, seeds: int) -> None:
    mechanism = OLH(d, 2.0, g=g, seed_family=seeds)
    table = _table(mechanism, list(range(d)))
    declared = mechanism.blanket_decomposition()
    if declared is None:  # some pair collides on every seed: only the generic pair (checked elsewhere)
        return
    assert declared.gamma <= table.min(axis=0).sum() + 1e-12
    for i, j in itertools.permutations(range(d), 2):
        assert decomposition_holds(table, declared, i, j), f"declared OLH decomposition fails for {i} -> {j}"
        assert decomposition_holds(table, _olh_pair_decomposition(mechanism, i, j), i, j)
        assert any(decomposition_holds(table, part, i, j) for part in declared.classes), f"no class covers {i}, {j}"


@pytest.mark.parametrize("factor", [1.02, 1.2])
def test_a_mutant_declaring_more_common_mass_fails(factor: float) -> None:
    grr = GRR(4, 2.0)
    table = _table(grr, [0, 1, 2, 3])
    honest = grr.blanket_decomposition()
    mutant = dataclasses.replace(honest, gamma=min(1.0, honest.gamma * factor))
    assert mutant.gamma > table.min(axis=0).sum()
    assert not decomposition_holds(table, mutant, 0, 1)
    assert decomposition_holds(table, honest, 0, 1)


def test_a_mutant_with_a_victim_leftover_the_blanket_lacks_fails() -> None:
    # OUE's victim weights on the k-RR-like shape (w0 = 1 - w1 - w2): the leftover L would need more of the
    # (1,1)/(0,0) cells than the victim has in the blanket's proportions.
    oue = OUE(3, 2.0)
    honest = oue.blanket_decomposition()
    mutant = dataclasses.replace(honest, w0=1.0 - honest.w1 - honest.w2)
    assert not decomposition_holds(_table(oue, [0, 1, 2]), mutant, 0, 1)


# ---- 2. against exact small crowds ------------------------------------------------------------------------------

def _log_multinomial(counts: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """log Mult(counts; sum, probs) along the last axis (-inf where a count is negative)."""
    total = counts.sum(axis=-1)
    with np.errstate(divide="ignore"):
        terms = counts * np.log(probs) - gammaln(counts + 1.0)
    out = gammaln(total + 1.0) + np.where(counts > 0, terms, -gammaln(counts + 1.0)).sum(axis=-1)
    return np.where((counts >= 0).all(axis=-1), out, -np.inf)


def krr_exact_epsilon(d: int, eps: float, n: int, delta: float, others: str) -> float:
    """Exact central epsilon of n shuffled k-RR reports (victim 0 vs 1, the other n - 1 all holding ``others``:
    "x" = 0, "x'" = 1 or "third" = 2), through the counts (c0, c1, c2, rest) of the histogram, which carry its
    whole likelihood ratio (the other d - 3 values are q under both inputs and under every other client)."""
    p = math.exp(eps) / (math.exp(eps) + d - 1)
    q = 1.0 / (math.exp(eps) + d - 1)
    cats = min(d, 3) + (1 if d > 3 else 0)  # categories: value 0, value 1, value 2 (d >= 3), the rest (d >= 4)
    sizes = [1, 1, 1, d - 3][:cats]

    def law(value: int) -> np.ndarray:
        out = np.array([q * s for s in sizes])
        out[value] = p
        return out

    held = {"x": 0, "x'": 1, "third": 2}[others]
    others_law = law(held)
    grids = np.stack(np.meshgrid(*[np.arange(n + 1)] * (cats - 1), indexing="ij"), axis=-1).reshape(-1, cats - 1)
    full = np.concatenate([grids, n - grids.sum(axis=1, keepdims=True)], axis=1)
    full = full[full[:, -1] >= 0]
    laws = []
    for victim in (0, 1):
        total = np.zeros(len(full))
        for y, weight in enumerate(law(victim)):
            rest = full.copy()
            rest[:, y] -= 1
            total += weight * np.exp(_log_multinomial(rest, others_law))
        laws.append(dict(enumerate(total.tolist())))
    return exact_epsilon(laws[0], laws[1], delta)


KRR_CASES = [(d, eps, n, delta) for d in (2, 3, 4, 8) for eps in (1.0, 2.0, 3.0) for n in (5, 12, 30)
             for delta in (1e-3, 1e-6)]


@pytest.mark.parametrize(("d", "eps", "n", "delta"), KRR_CASES,
                         ids=[f"d={c[0]} eps={c[1]:g} n={c[2]} delta={c[3]:g}" for c in KRR_CASES])
def test_krr_published_epsilon_bounds_the_exact_one(d: int, eps: float, n: int, delta: float) -> None:
    grr = GRR(d, eps)
    exact = max(krr_exact_epsilon(d, eps, n, delta, others) for others in (["x", "x'", "third"] if d > 2 else
                                                                             ["x", "x'"]))
    published, _ = best_epsilon(n, grr.mixture_alpha, eps, delta, grr.blanket_decomposition())
    blanket = epsilon_blanket_shuffle(n, grr.blanket_decomposition(), eps, delta)
    assert published >= exact - TOLERANCE
    assert blanket >= exact - TOLERANCE, f"blanket pair {blanket:.6f} < exact {exact:.6f}"


def test_the_exact_krr_counts_reproduce_the_documented_value() -> None:
    # docs/mathematics.md §1.2: GRR d = 4, eps0 = 2, n = 15, delta = 1e-3, others holding the victim's value.
    assert krr_exact_epsilon(4, 2.0, 15, 1e-3, "x") == pytest.approx(1.8186, abs=1e-4)


@pytest.mark.parametrize(("label", "mechanism", "inputs", "n"),
                         [c for c in ENUMERATED_CASES if not c[0].startswith("collision")],
                         ids=[c[0] for c in ENUMERATED_CASES if not c[0].startswith("collision")])
def test_published_epsilon_and_blanket_pld_bound_the_enumerated_crowds(label: str, mechanism: object,
                                                                         inputs: list[object], n: int) -> None:
    table = np.array([mechanism.exact_output_distribution(x) for x in inputs])  # type: ignore[attr-defined]
    exact, where = worst_exact_epsilon(table, n, 1e-3)
    dec = mechanism.blanket_decomposition()  # type: ignore[attr-defined]
    eps = mechanism.epsilon_local  # type: ignore[attr-defined]
    published, _ = best_epsilon(n, mechanism.mixture_alpha, eps, 1e-3, dec)  # type: ignore[attr-defined]
    assert published >= exact - TOLERANCE, f"{label}: published {published:.6f} < exact {exact:.6f} ({where})"
    if dec is not None:
        assert epsilon_blanket_shuffle(n, dec, eps, 1e-3) >= exact - TOLERANCE
        assert blanket_shuffle_pld(n, dec, 1e-4).get_epsilon_for_delta(1e-3) >= exact - TOLERANCE


# ---- 3. one-pair lower bounds at n = 1,000 and 50,000; the targets --------------------------------------

def krr_one_pair_lower_bound(d: int, eps: float, n: int, delta: float, held: int, sds: float = 7.0) -> float:
    """Exact epsilon of one neighbouring pair (victim 0 vs 1, every other client holding ``held``: 0, or 2 the
    value outside the pair), summed over a window of the counts within ``sds`` standard deviations: dropping
    cells only lowers the divergence, so this is a lower bound on the true central epsilon. The histogram's
    likelihood ratio depends on (c0, c1) when the others hold 0 and on (c0, c1, c2) when they hold 2."""
    p = math.exp(eps) / (math.exp(eps) + d - 1)
    q = 1.0 / (math.exp(eps) + d - 1)
    named = 3 if held == 2 else 2  # categories 0, 1 (, 2), then the rest
    others = np.array([q] * named + [1.0 - named * q])
    others[held] = p
    others[-1] = 1.0 - others[:-1].sum()
    axes = []
    for r in others[:-1]:
        half = int(sds * math.sqrt((n - 1) * r * (1 - r))) + 2
        axes.append(np.arange(max(0, round((n - 1) * r) - half), min(n, round((n - 1) * r) + half) + 1))
    counts = [np.asarray(g, dtype=np.float64) for g in np.meshgrid(*axes, indexing="ij")]
    counts.append(n - sum(counts))
    laws = []
    for victim_value in (0, 1):
        victim = np.array([q] * named + [0.0])
        victim[victim_value] = p
        victim[-1] = 1.0 - victim[:-1].sum()
        total = np.zeros(counts[0].shape)
        for y in range(named + 1):
            parts = [c - (1.0 if i == y else 0.0) for i, c in enumerate(counts)]
            ok = np.logical_and.reduce([c >= 0 for c in parts])
            log_m = gammaln(float(n)) - sum(gammaln(np.maximum(c, 0.0) + 1.0) for c in parts)
            log_m = log_m + sum(c * math.log(r) for c, r in zip(parts, others, strict=True))
            total += victim[y] * np.where(ok, np.exp(log_m), 0.0)
        laws.append(total.ravel())
    return _array_epsilon(laws[0], laws[1], delta)


def _array_epsilon(p: np.ndarray, q: np.ndarray, delta: float) -> float:
    """``shuffle_enumeration.exact_epsilon`` on two aligned arrays (no dictionaries of millions of cells)."""
    keep = (p > 0) | (q > 0)
    p, q = p[keep], q[keep]

    def divergence(eps: float) -> float:
        e = math.exp(eps)
        return max(float(np.maximum(p - e * q, 0.0).sum()), float(np.maximum(q - e * p, 0.0).sum()))

    low, high = 0.0, 1.0
    while divergence(high) > delta:
        low, high = high, 2.0 * high
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if divergence(middle) > delta else (low, middle)
    return low


@pytest.mark.parametrize("n", [1_000, 50_000])
def test_krr_d8_is_never_below_one_pair(n: int) -> None:
    grr = GRR(8, 2.0)
    # others holding the pair's value 0 (n = 50,000: a 2-D window) or a third value (n = 1,000: 3-D, the worst)
    lower = krr_one_pair_lower_bound(8, 2.0, n, 1e-6, held=2 if n == 1_000 else 0)
    published, bound = best_epsilon(n, grr.mixture_alpha, 2.0, 1e-6, grr.blanket_decomposition())
    assert bound == BOUND_BLANKET
    assert lower <= published
    if n == 1_000:  # the target: within 5% of the valid 0.2930; one pair already needs 0.2929
        assert lower == pytest.approx(0.2929, abs=2e-4)
        assert published <= 0.308


def test_olh_d64_at_n_1000() -> None:
    # The default family's pairs collide on 9.2%..16.1% of the seeds: the one decomposition covering all of them
    # gives 0.3025, the largest over 8 classes of collision rates 0.2913 (the generic pair 0.397; one pair's
    # exact value 0.209, issue 33). The target: at most 0.301.
    olh = OLH(64, 2.0)
    dec = olh.blanket_decomposition()
    assert len(dec.classes) == 8
    published, bound = best_epsilon(1_000, olh.mixture_alpha, 2.0, 1e-6, dec)
    assert bound == BOUND_BLANKET
    assert 0.209 <= published <= 0.301
    assert published < epsilon_blanket_shuffle(1_000, dec, 2.0, 1e-6)


@pytest.mark.parametrize("n", [1_000, 30_000, 100_000])
def test_blanket_pld_fits_says_whether_its_pld_can_be_built(n: int) -> None:
    # The odometer counts first and chooses between the pairs only where the blanket PLD can be built; at the
    # odometer's grid for eps ~0.026 (2.56e-5) OLH d = 64 fits up to 30,000 clients and not at 100,000.
    dec = dataclasses.replace(OLH(64, 2.0).blanket_decomposition(), classes=(), rule="")  # as a ledger keeps it
    try:
        blanket_shuffle_pld(n, dec, 2.56e-5)
        built = True
    except PLDTooLargeError:
        built = False
    assert blanket_pld_fits(n, dec, 2.56e-5) is built
    assert built is (n < 100_000)


def test_the_odometer_does_not_choose_a_pair_whose_pld_it_cannot_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from transforms.privacy import window_release
    from transforms.privacy.shuffle_pld import shuffle_pld

    olh = OLH(64, 2.0)
    dec = dataclasses.replace(olh.blanket_decomposition(), classes=(), rule="")
    release = window_release.WindowRelease(olh.mixture_alpha, 2.0, 100_000, blanket=dec.as_tuple())

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("best_epsilon asked although the blanket PLD cannot be built")

    monkeypatch.setattr(window_release, "best_epsilon", refuse)
    got = window_release.reports_pld(release, 100_000, 2.56e-5, 1e-6)
    want = shuffle_pld(100_000, olh.mixture_alpha, 2.0, 2.56e-5)
    assert got.get_epsilon_for_delta(1e-6) == want.get_epsilon_for_delta(1e-6)
