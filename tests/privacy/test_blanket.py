"""The privacy blanket's accounting (transforms/privacy/blanket.py) against an independent brute force.

The brute force enumerates every sequence (victim's report, dummy 1, ..., dummy m), maps it to the multiset the
adversary sees (its histogram over the outputs: GRR's d values, or OUE's 2^d whole bit patterns) and sums the
probabilities of each multiset under x and x': no reduction to two counts, no binomial tail, no knowledge of
which outputs are exchangeable. The module's two
evaluations (grid in log space, binomial tails) must agree with it to rounding, for every pair of inputs.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from transforms.privacy.blanket import (
    BlanketDivergence,
    blanket_divergence_grid,
    dummies_needed,
    epsilon_against_colluders,
    epsilon_blanket,
    grr_blanket_weight,
    oue_blanket_weight,
    per_report_delta,
)
from transforms.privacy.composition import chain_composition
from transforms.privacy.mixture import alpha_grr
from transforms.privacy.shuffle_bound import epsilon_central


def grr_law(d: int, eps0: float, x: int) -> np.ndarray:
    """GRR's output law for input x, written out independently of the module."""
    e = math.exp(eps0)
    law = np.full(d, 1.0 / (e + d - 1))
    law[x] = e / (e + d - 1)
    return law


def view_laws(victim: list[np.ndarray], dummy: np.ndarray, m: int, fixed: np.ndarray | None = None) -> list[np.ndarray]:
    """Exact law of the histogram of (victim's report + m dummies [+ reports of law ``fixed[i]``]), one array
    of probabilities per victim law, indexed by a common enumeration of the multisets."""
    d = len(dummy)
    laws = [dummy] * m + ([] if fixed is None else list(fixed))
    seqs = np.array(list(itertools.product(range(d), repeat=len(laws) + 1)))
    rest = np.ones(len(seqs))
    for j, law in enumerate(laws, start=1):
        rest *= law[seqs[:, j]]
    hist = np.stack([(seqs == v).sum(axis=1) for v in range(d)], axis=1)
    key = hist @ (len(laws) + 2) ** np.arange(d)
    _, index = np.unique(key, return_inverse=True)
    return [np.bincount(index, law[seqs[:, 0]] * rest) for law in victim]


def brute_divergence(p_view: np.ndarray, q_view: np.ndarray, eps: float) -> float:
    return float(np.maximum(0.0, p_view - math.exp(eps) * q_view).sum())


def brute_epsilon(p_view: np.ndarray, q_view: np.ndarray, delta: float, hi: float) -> float:
    low, high = 0.0, hi
    for _ in range(64):
        mid = 0.5 * (low + high)
        if max(brute_divergence(p_view, q_view, mid), brute_divergence(q_view, p_view, mid)) <= delta:
            high = mid
        else:
            low = mid
    return high


@pytest.mark.parametrize(("d", "m"), [(2, 9), (3, 6), (4, 5), (5, 4), (6, 3)])
@pytest.mark.parametrize("eps0", [0.5, 2.0, 5.0])
def test_divergence_matches_brute_force_over_full_multisets(d: int, m: int, eps0: float) -> None:
    """(a) every pair (x, x') and both directions: the sufficiency of (h_x, h_x') is checked, not assumed."""
    uniform = np.full(d, 1.0 / d)
    exact = BlanketDivergence(d, eps0, m, tail=None)
    windowed = BlanketDivergence(d, eps0, m)
    for x, x_other in itertools.permutations(range(d), 2):
        p_view, q_view = view_laws([grr_law(d, eps0, x), grr_law(d, eps0, x_other)], uniform, m)
        for eps in (0.0, 0.1, 0.4, 1.0, eps0 * 0.9):
            want = brute_divergence(p_view, q_view, eps)
            assert exact(eps) == pytest.approx(want, rel=1e-11, abs=1e-16), (x, x_other, eps)
            assert windowed(eps) == pytest.approx(want, rel=1e-11, abs=1e-16), (x, x_other, eps)
            assert blanket_divergence_grid(d, eps0, m, eps) == pytest.approx(want, rel=1e-11, abs=1e-16)


def oue_law(d: int, eps0: float, x: int | None) -> np.ndarray:
    """OUE's law over the 2^d bit patterns (bit j of the index = item j) for input x; x = None: every bit Bern(q)
    (the blanket). Written out independently of the module."""
    q = 1.0 / (1.0 + math.exp(eps0))
    one = np.full(d, q)
    if x is not None:
        one[x] = 0.5
    patterns = (np.arange(2**d)[:, None] >> np.arange(d)[None, :]) & 1
    return np.prod(np.where(patterns == 1, one, 1.0 - one), axis=1)


@pytest.mark.parametrize(("d", "m"), [(2, 5), (3, 3), (3, 4), (4, 2)])
@pytest.mark.parametrize("eps0", [0.5, 2.0, 5.0])
def test_oue_divergence_matches_brute_force_over_whole_bit_patterns(d: int, m: int, eps0: float) -> None:
    """(a) for OUE: the multiset of m + 1 whole bit patterns, so the sufficiency of the two columns' counts is
    checked, not assumed."""
    exact = BlanketDivergence(d, eps0, m, randomizer="oue", tail=None)
    windowed = BlanketDivergence(d, eps0, m, randomizer="oue")
    for x, x_other in itertools.permutations(range(d), 2):
        p_view, q_view = view_laws([oue_law(d, eps0, x), oue_law(d, eps0, x_other)], oue_law(d, eps0, None), m)
        for eps in (0.0, 0.1, 0.4, 1.0, eps0 * 0.9):
            want = brute_divergence(p_view, q_view, eps)
            assert exact(eps) == pytest.approx(want, rel=1e-11, abs=1e-16), (x, x_other, eps)
            assert windowed(eps) == pytest.approx(want, rel=1e-11, abs=1e-16), (x, x_other, eps)
            assert blanket_divergence_grid(d, eps0, m, eps, randomizer="oue") == pytest.approx(want, rel=1e-11,
                                                                                                abs=1e-16)
    if d == 3 and m == 3:
        p_view, q_view = view_laws([oue_law(d, eps0, 0), oue_law(d, eps0, 1)], oue_law(d, eps0, None), m)
        for delta in (1e-2, 1e-4):
            want = brute_epsilon(p_view, q_view, delta, eps0)
            assert epsilon_blanket(d, eps0, m, delta, randomizer="oue") == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("d", "m", "eps0"), [(2, 10, 1.0), (4, 5, 2.0), (3, 7, 4.0)])
def test_epsilon_matches_brute_force_inversion(d: int, m: int, eps0: float) -> None:
    uniform = np.full(d, 1.0 / d)
    p_view, q_view = view_laws([grr_law(d, eps0, 0), grr_law(d, eps0, 1)], uniform, m)
    for delta in (1e-2, 1e-4, 1e-6):
        want = brute_epsilon(p_view, q_view, delta, eps0)
        got = epsilon_blanket(d, eps0, m, delta)
        assert got == pytest.approx(want, abs=1e-12)
        assert brute_divergence(p_view, q_view, got) <= delta * (1 + 1e-12)  # certified, up to summation order


@pytest.mark.parametrize(("d", "eps0", "m"), [(2, 1.0, 300), (16, 2.0, 2000), (128, 4.0, 5000)])
def test_returned_epsilon_is_certified(d: int, eps0: float, m: int) -> None:
    """The result satisfies D <= delta exactly for the divergence it was bisected on (never the lower end of the
    bisection, which is not certified), and the exact sum agrees up to summation order."""
    for delta in (1e-5, 1e-6, 1e-9):
        eps = epsilon_blanket(d, eps0, m, delta)
        assert BlanketDivergence(d, eps0, m)(eps) <= delta
        assert BlanketDivergence(d, eps0, m, tail=None)(eps) <= delta * (1 + 1e-12)
        assert BlanketDivergence(d, eps0, m, tail=None)(eps - 1e-9) > delta  # and tight


@pytest.mark.parametrize(("randomizer", "d"), [("grr", 2), ("grr", 5), ("grr", 64), ("oue", 16)])
def test_tail_form_matches_log_space_grid_at_moderate_m(randomizer: str, d: int) -> None:
    """The O(m) binomial-tail form against the O(m^2) log-space grid where enumeration is impossible, down to
    divergences of 1e-40; the window's value is an upper bound within its tail mass of the exact one."""
    for m in (200, 700):
        exact = BlanketDivergence(d, 2.0, m, randomizer=randomizer, tail=None)
        windowed = BlanketDivergence(d, 2.0, m, randomizer=randomizer)
        for eps in (0.05, 0.3, 0.8):
            grid = blanket_divergence_grid(d, 2.0, m, eps, randomizer=randomizer)
            if grid < 1e-40:
                continue
            assert exact(eps) == pytest.approx(grid, rel=1e-9)
            # (up to the rounding of summing in another order)
            assert exact(eps) * (1 - 1e-12) <= windowed(eps) <= exact(eps) * (1 + 1e-12) + 2 * windowed.neglected_mass


def test_no_dummies_gives_back_the_local_guarantee() -> None:
    """m = 0: the view is the victim's report, D = q (e^eps0 - e^eps), so eps = ln(e^eps0 - delta/q)."""
    for d, eps0 in ((2, 1.0), (4, 2.0), (128, 4.0)):
        q = 1.0 / (math.exp(eps0) + d - 1)
        for delta in (1e-3, 1e-6):
            assert epsilon_blanket(d, eps0, 0, delta) == pytest.approx(math.log(math.exp(eps0) - delta / q), abs=1e-12)
    # OUE: only (x-bit, x'-bit) = (1, 0) favours x, with P = (1 - q)/2 and Q = q/2: eps = ln(e^eps0 - 2 delta/q)
    for eps0 in (1.0, 2.0, 4.0):
        q = 1.0 / (1.0 + math.exp(eps0))
        for delta in (1e-3, 1e-6):
            want = math.log(math.exp(eps0) - 2.0 * delta / q)
            assert epsilon_blanket(16, eps0, 0, delta, randomizer="oue") == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("randomizer", "d", "eps0"), [("grr", 2, 1.0), ("grr", 16, 2.0), ("grr", 128, 4.0),
                                                      ("oue", 64, 1.0), ("oue", 64, 4.0)])
def test_monotone_in_the_number_of_dummies(randomizer: str, d: int, eps0: float) -> None:
    """(c) a dummy is post-processing: the divergence (exact) and the epsilon never grow with m."""
    ms = list(range(0, 60)) + list(range(60, 3000, 97))
    divergences = [BlanketDivergence(d, eps0, m, randomizer=randomizer, tail=None)(0.3) for m in ms]
    assert all(b <= a * (1 + 1e-12) + 1e-300 for a, b in itertools.pairwise(divergences))
    eps = [epsilon_blanket(d, eps0, m, 1e-6, randomizer=randomizer) for m in ms]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(eps))
    assert eps[-1] < 0.5 * eps[0]


@pytest.mark.parametrize(("randomizer", "d", "eps0", "target"), [
    ("grr", 2, 1.0, 0.5), ("grr", 16, 2.0, 1.0), ("grr", 128, 4.0, 0.5), ("grr", 4, 2.0, 0.2), ("oue", 32, 2.0, 0.5),
    ("oue", 32, 4.0, 0.5)])
def test_dummies_needed_is_the_smallest_m(randomizer: str, d: int, eps0: float, target: float) -> None:
    kw = {"randomizer": randomizer}
    m = dummies_needed(d, eps0, target, 1e-6, **kw)
    assert epsilon_blanket(d, eps0, m, 1e-6, **kw) <= target < epsilon_blanket(d, eps0, m - 1, 1e-6, **kw)
    assert dummies_needed(d, eps0, eps0 + 0.1, 1e-6, **kw) == 0
    with pytest.raises(ValueError, match="dummies would be needed"):
        dummies_needed(d, eps0, 1e-3, 1e-6, max_dummies=100, **kw)


def test_k_reports_chain_like_the_analyzer() -> None:
    """k reports of one device: k * eps at delta' = delta / sum_{i<k} e^{i eps0} (the analyzer's rule for k
    reports), and the chained delta at the eps actually reached stays within delta."""
    d, eps0, m, delta, k = 16, 2.0, 400, 1e-6, 3
    spread = sum(math.exp(i * eps0) for i in range(k))
    assert per_report_delta(eps0, delta, k) == pytest.approx(delta / spread, rel=1e-12)
    one = epsilon_blanket(d, eps0, m, delta / spread)
    assert epsilon_blanket(d, eps0, m, delta, k) == pytest.approx(k * one, rel=1e-12)
    assert chain_composition(one, delta / spread, k)[1] <= delta
    with pytest.raises(ValueError, match="no per-report delta"):
        dummies_needed(d, 300.0, 1.0, delta, 3)
    assert epsilon_blanket(d, 300.0, m, delta, 3) == 900.0
    assert epsilon_blanket(d, eps0, m, delta, k) > epsilon_blanket(d, eps0, m, delta)
    for target in (1.5, 0.83, 1.55):  # 3 * (0.83 / 3) and 3 * (1.55 / 3) round above their targets
        m_k = dummies_needed(d, eps0, target, delta, k)
        assert epsilon_blanket(d, eps0, m_k, delta, k) <= target < epsilon_blanket(d, eps0, m_k - 1, delta, k)


def test_min_of_honest_bound_and_blanket_holds_with_honest_others() -> None:
    """Both terms of ``epsilon_against_colluders`` bound the exact epsilon of a small release: victim, 2 honest
    others (every choice of their values) and m dummies, the honest others' reports unknown to the adversary."""
    d, eps0, m, delta = 3, 2.0, 3, 1e-2
    uniform = np.full(d, 1.0 / d)
    honest = epsilon_central(3, alpha_grr(eps0, d), eps0, delta, window_sds=None)
    blanket = epsilon_blanket(d, eps0, m, delta)
    bound = epsilon_against_colluders(honest, blanket)
    assert bound == min(honest, blanket)
    for others in itertools.product(range(d), repeat=2):
        fixed = np.stack([grr_law(d, eps0, v) for v in others])
        p_view, q_view = view_laws([grr_law(d, eps0, 0), grr_law(d, eps0, 1)], uniform, m, fixed)
        assert brute_epsilon(p_view, q_view, delta, eps0) <= bound + 1e-9, others


def test_finding_9_numbers() -> None:
    """(e) Issue 26 finding 9: a victim alone among 200 colluders (GRR d = 4, eps0 = 2, delta = 1e-5). The
    rows claim the certified shuffle bound for 201 devices (0.864); the colluders' reports are known, so the
    release is a bijective function of the victim's report: exactly the local guarantee. With m dummies it is
    exactly the blanket's epsilon, and the colluder-proof value is that (one honest device: no amplification)."""
    d, eps0, delta = 4, 2.0, 1e-5
    claimed = epsilon_central(201, alpha_grr(eps0, d), eps0, delta)
    assert 0.86 <= claimed <= 0.87
    q = 1.0 / (math.exp(eps0) + d - 1)
    alone = epsilon_blanket(d, eps0, 0, delta)
    assert alone == pytest.approx(math.log(math.exp(eps0) - delta / q), abs=1e-12)
    assert alone > 1.99 > claimed
    m = dummies_needed(d, eps0, claimed, delta)
    hidden = epsilon_blanket(d, eps0, m, delta)
    assert hidden <= claimed < epsilon_blanket(d, eps0, m - 1, delta)
    assert epsilon_against_colluders(eps0, hidden) == hidden  # n - c = 1 honest report: eps_local
    assert m == 57  # the price at this setting: 57 dummies for one crowd's release


def test_blanket_weight_and_bad_input() -> None:
    assert grr_blanket_weight(2.0, 4) == pytest.approx(4 / (math.exp(2.0) + 3))
    assert grr_blanket_weight(700.0, 2) > 0.0
    for bad in ({"d": 1}, {"m": -1}, {"eps0": 0.0}, {"m": 2.5}):
        args = {"d": 4, "eps0": 1.0, "m": 10, **bad}
        with pytest.raises(ValueError):
            BlanketDivergence(args["d"], args["eps0"], args["m"])
    with pytest.raises(ValueError, match="delta"):
        epsilon_blanket(4, 1.0, 10, 1.0)
    with pytest.raises(ValueError, match="no blanket accounting for 'olh'"):
        epsilon_blanket(4, 1.0, 10, 1e-6, randomizer="olh")
    assert oue_blanket_weight(2.0) == pytest.approx((1 + math.exp(2.0)) / (2 * math.exp(2.0)))


def test_benchmark_runs_and_its_rows_hold(tmp_path, capsys) -> None:
    """benchmarks/blanket.py --quick: every row reaches its target with the m it prints, and the stderr ratio is
    the closed form sqrt(1 + m B (1 - B) / V)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "blanket.py"
    spec = importlib.util.spec_from_file_location("blanket_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--quick", "--json", str(tmp_path / "rows.json")])
    assert len(rows) == 4 and "eps time" in capsys.readouterr().out
    e = math.exp(2.0)
    for row in rows:
        kw = {"randomizer": row["randomizer"]}
        assert row["eps_blanket"] <= row["target"] < epsilon_blanket(16, 2.0, row["m"] - 1, 1e-6, **kw)
        grr = row["randomizer"] == "grr"
        p, q, cell = (e / (e + 15), 1 / (e + 15), 1 / 16) if grr else (0.5, 1 / (1 + e), 1 / (1 + e))
        real = 625 * p * (1 - p) + 9375 * q * (1 - q)
        assert row["stderr_ratio"] == pytest.approx(math.sqrt(1 + row["m"] * cell * (1 - cell) / real), rel=1e-12)
