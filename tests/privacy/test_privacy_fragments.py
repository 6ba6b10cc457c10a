"""Accounting of [ESA]'s fragmented unary encodings: [ESA]'s tables (Lemma II.6 / Thm III.1),
[ESA] Thm IV.1 values, Thm IV.2 as printed and its recomputation, the tight bounds checked against exact
shuffled-count divergences, and the ``esa privacy`` JSON contract for rappor / rappor_fragments."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.signal import fftconvolve
from scipy.stats import binom

from pipelines.cli import main
from tests.privacy.spec_tables import TABLE_11_2
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor, ReportFragmentedRappor
from transforms.privacy.closed_forms import lemma_ii6, lemma_ii6_rappor, theorem_iii1
from transforms.privacy.composition import bun_steinke_composition, fragment_epsilon
from transforms.privacy.fragment_report import fragmented_privacy_report
from transforms.privacy.fragments import (
    default_fragment_epsilon,
    fragment_rows_bound,
    fragments_tight,
    rappor_tight,
    replacement_central,
    replacement_tight,
    theorem_iv2,
)
from transforms.privacy.report import build_privacy_report, format_privacy_report, privacy_report
from transforms.privacy.shuffle_bound import epsilon_central

# [ESA]'s tables: (dataset, n, delta, eps, table eps_c, Lemma II.6 eps_c, Thm III.1 eps_c)
TABLE_11_1 = [
    ("Horse", 1_914_589, 5e-8, 2.94, 0.05, 0.04992, 0.10727),
    ("Horse", 1_914_589, 5e-8, 8.55, 1.0, 1.00177, 1.77283),
    ("Map", 236_559_063, 5e-10, 7.385, 0.05, 0.05012, 0.09971),
    ("Map", 236_559_063, 5e-10, 13.14, 1.0, 1.00189, 1.77185),
    ("Child", 50_409_435, 5e-9, 10.435, 0.5, 0.50036, 0.94112),
    ("Heavy-hitter", 203_950_512, 5e-10, 1.78, 0.0025, 0.00251, 0.00651),
    ("Heavy-hitter", 203_950_512, 5e-10, 12.99, 1.0, 1.00093, 1.77037),
]
PRINTED = 6e-6  # the table columns are printed with 5 decimals


@pytest.mark.parametrize(("name", "n", "delta", "eps", "table", "lemma", "thm"), TABLE_11_1)
def test_table_11_1(name: str, n: int, delta: float, eps: float, table: float, lemma: float, thm: float) -> None:
    value = lemma_ii6_rappor(n, eps, delta).epsilon
    assert value == pytest.approx(table, rel=0.01)  # [ESA]'s published table (LDP eps printed to 2-3 decimals)
    assert value == pytest.approx(lemma, abs=PRINTED)
    assert theorem_iii1(n, eps, delta).epsilon == pytest.approx(thm, abs=PRINTED)
    if n < 10**8:  # the report also runs the tight bound, which takes seconds at n ~ 2e8 and low eps
        report = fragmented_privacy_report("rappor", 87_680, eps, n, delta)
        assert report["eps_central_removal"] == value and report["eps_central_removal_rule"].startswith("lemma_ii6")
        assert report["closed_forms"]["theorem_iii1"]["epsilon"] == pytest.approx(thm, abs=PRINTED)


def test_lemma_ii6_is_the_independent_formula() -> None:
    n, eps, delta = 1_914_589, 8.55, 5e-8
    lam = 2 * n / (1 + math.exp(eps))
    lam_p = lam - math.sqrt(2 * lam * math.log(2 / delta))
    assert lemma_ii6_rappor(n, eps, delta).epsilon == pytest.approx(
        math.sqrt(32 * math.log(4 / delta) / lam_p) * (1 - lam_p / n), rel=1e-12
    )


@pytest.mark.parametrize(("eps_b", "eps_f", "t", "expected"), TABLE_11_2)
def test_table_11_2(eps_b: float, eps_f: float, t: int, expected: float) -> None:
    mech = ReportFragmentedRappor(16, eps_b, eps_f, fragments=max(t, 4))
    assert mech.epsilon_exposed(t) == pytest.approx(expected, abs=1e-4)
    report = fragmented_privacy_report("rappor_fragments", 16, eps_b, 10**6, 1e-8, fragments=t, epsilon_fragment=eps_f)
    assert report["epsilon_exposed"][t - 1] == pytest.approx(expected, abs=1e-4)
    assert report["epsilon_local"] == report["epsilon_exposed"][-1]
    direct = math.log((math.exp(eps_b + t * eps_f) + 1) / (math.exp(eps_b) + math.exp(t * eps_f)))
    assert mech.epsilon_exposed(t) == pytest.approx(direct, rel=1e-12)


def test_expected_messages_horse() -> None:
    report = fragmented_privacy_report("rappor", 87_680, 8.55, 1_914_589, 5e-8)
    assert report["expected_messages"] == pytest.approx(17.97, abs=0.005)
    assert report["expected_messages"] == pytest.approx(AttributeFragmentedRappor(87_680, 8.55).expected_messages)
    frag = fragmented_privacy_report("rappor_fragments", 50, 3.0, 10**5, 1e-6, fragments=4, epsilon_fragment=2.0)
    assert frag["expected_messages"] == pytest.approx(ReportFragmentedRappor(50, 3.0, 2.0, 4).expected_messages)


@pytest.mark.parametrize(("eps_b", "tau"), [(2.94, 4), (2.94, 16), (8.55, 4), (1.0, 256), (13.0, 3)])
def test_default_fragment_epsilon_solves_the_variance_rule(eps_b: float, tau: int) -> None:
    def g(x: float) -> float:
        return math.exp(x) / math.expm1(x) ** 2

    root = brentq(lambda x: g(x) / tau - g(eps_b), 1e-9, eps_b, xtol=1e-14)
    assert default_fragment_epsilon(eps_b, tau) == pytest.approx(root, rel=1e-9)
    assert ReportFragmentedRappor(10, eps_b, fragments=tau).epsilon_fragment == default_fragment_epsilon(eps_b, tau)


def test_default_fragment_epsilon_landmarks() -> None:
    assert default_fragment_epsilon(2.5, 1) == pytest.approx(2.5, rel=1e-14)
    # close to (not exactly) [ESA]'s published pair (8.55, 7.163) for tau = 4; 2.94 -> 1.805, not 1.5897
    assert default_fragment_epsilon(8.55, 4) == pytest.approx(7.163, abs=0.005)
    assert default_fragment_epsilon(2.94, 4) == pytest.approx(1.8046, abs=1e-4)


def test_theorem_iv2_as_printed() -> None:
    n, eps_b, eps_f, tau, delta = 1_914_589, 2.94, 1.5897, 4, 5e-8
    rows = math.sqrt(8 * tau * eps_f * math.log(tau * eps_f / delta) ** 2 / n)
    backstop = math.sqrt(64 * math.exp(eps_b) * math.log(4 / delta) / n)
    assert theorem_iv2(n, eps_b, eps_f, tau, delta).epsilon == pytest.approx(min(rows, backstop), rel=1e-12)
    assert "eps_f > 1" in theorem_iv2(n, eps_b, 0.5586, 16, delta).reason
    assert "delta < 1/2" in theorem_iv2(n, eps_b, 2.0, 4, 0.6).reason


@pytest.mark.parametrize(("eps_b", "eps_f", "tau"), [(2.94, 1.5897, 4), (2.94, 0.5586, 16), (8.55, 7.163, 4)])
def test_fragment_rows_recomputation(eps_b: float, eps_f: float, tau: int) -> None:
    n, delta = 1_914_589, 5e-8
    eps_one = fragment_epsilon(eps_b, eps_f, 1)
    lam = 2 * n / (1 + math.exp(eps_one))
    row = lemma_ii6(n, lam, delta / (2 * tau)).epsilon
    advanced = bun_steinke_composition(row, delta / (2 * tau), tau, delta / 2)[0]
    assert fragment_rows_bound(n, eps_b, eps_f, tau, delta).epsilon == pytest.approx(min(tau * row, advanced))
    assert fragment_rows_bound(n, eps_b, eps_f, 1, delta).epsilon == pytest.approx(lemma_ii6(n, lam, delta).epsilon)


def _hockey(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    return float(max(np.maximum(p - math.exp(eps) * q, 0).sum(), np.maximum(q - math.exp(eps) * p, 0).sum()))


@pytest.mark.parametrize(("n", "eps", "delta"), [(400, 1.0, 1e-4), (2000, 3.0, 1e-5), (20_000, 3.0, 1e-3)])
def test_rappor_bounds_hold_for_exact_shuffled_counts(n: int, eps: float, delta: float) -> None:
    """Removal of one user = its bit v is RR(1) vs RR(0) in channel v; the analyzer sees that channel's count.
    The certified (eps_c, delta) must bound the exact divergence for every dataset of the other n - 1 users."""
    q = 1 / (1 + math.exp(eps))
    tight = rappor_tight(n, eps, delta)
    bounds = [tight, lemma_ii6_rappor(n, eps, delta).epsilon]  # Lemma II.6 applies to all three cases
    for ones in (0, (n - 1) // 3, n - 1):  # others holding the value
        others = fftconvolve(binom.pmf(np.arange(ones + 1), ones, 1 - q),
                             binom.pmf(np.arange(n - ones), n - 1 - ones, q))
        with_user = np.clip(np.append(others, 0) * q + np.append(0, others) * (1 - q), 0, None)
        reference = np.clip(np.append(others, 0) * (1 - q) + np.append(0, others) * q, 0, None)
        for eps_c in bounds:
            assert _hockey(with_user, reference, eps_c) <= delta * (1 + 1e-6)
        if ones == 0:  # within a factor 2 of the truth: half the bound is not private at delta
            assert _hockey(with_user, reference, 0.5 * tight) > delta


def test_fragment_tuple_tight_bound_holds_for_exact_row_counts() -> None:
    """tau = 2 rows of one bit: the analyzer sees (C_1, C_2); exact law by convolving per-user tuple laws."""
    n, eps_b, eps_f, delta = 120, 2.0, 1.0, 1e-3
    q_b, q_f = 1 / (1 + math.exp(eps_b)), 1 / (1 + math.exp(eps_f))

    def tuple_law(bit: int) -> np.ndarray:  # 2x2 law of (y_1, y_2)
        law = np.zeros((2, 2))
        for backstop, weight in ((1, 1 - q_b if bit else q_b), (0, q_b if bit else 1 - q_b)):
            one = 1 - q_f if backstop else q_f
            y = np.array([1 - one, one])
            law += weight * np.outer(y, y)
        return law

    def counts(ones: int, extra: np.ndarray) -> np.ndarray:
        out = extra
        for law in [tuple_law(1)] * ones + [tuple_law(0)] * (n - 1 - ones):
            out = fftconvolve(out, law)
        return np.clip(out, 0, None)

    eps_c = fragments_tight(n, eps_b, eps_f, 2, delta)
    eps_tuple = math.log((math.exp(eps_b + 2 * eps_f) + 1) / (math.exp(eps_b) + math.exp(2 * eps_f)))
    assert eps_c == pytest.approx(epsilon_central(n, 1 / (math.exp(eps_tuple) + 1), eps_tuple, delta), rel=1e-9)
    assert eps_c < eps_tuple
    for ones in (0, 40, n - 1):
        with_user, reference = counts(ones, tuple_law(1)), counts(ones, tuple_law(0))
        assert _hockey(with_user, reference, eps_c) <= delta * (1 + 1e-6)
        if ones == 0:
            assert _hockey(with_user, reference, 0.5 * eps_c) > delta


def test_replacement_and_fallback() -> None:
    assert replacement_central(0.3, 1e-6) == (0.6, 2e-6)
    report = fragmented_privacy_report("rappor", 100, 5.0, 1000, 1e-6)  # lambda = 13.4 < 14 ln(4/delta)
    assert report["closed_forms"]["lemma_ii6"]["epsilon"] is None
    assert report["eps_central_removal"] == report["eps_central_removal_tight"] == rappor_tight(1000, 5.0, 1e-6)
    assert report["eps_central_removal_rule"].startswith("tight")
    assert report["eps_central_replacement_basic"] == {"epsilon": 2 * report["eps_central_removal"], "delta": 2e-6}
    # the ledger value: replacement DP, tighter than the basic (2 eps, 2 delta) and above one removal
    assert report["eps_central_removal"] < report["eps_central"] < 2 * report["eps_central_removal"]
    assert report["eps_central"] == pytest.approx(replacement_tight(1000, 1 / (math.exp(5.0) + 1), 5.0, 1e-6), rel=1e-6)


def test_dispatch_and_errors() -> None:
    assert build_privacy_report("grr", 10, 1.0, 1000, 1e-6) == privacy_report("grr", 10, 1.0, 1000, 1e-6)
    with pytest.raises(ValueError, match="multi-message mechanism: use build_privacy_report"):
        privacy_report("rappor", 10, 1.0, 1000, 1e-6)
    with pytest.raises(ValueError, match="rappor_fragments only"):
        build_privacy_report("grr", 10, 1.0, 1000, 1e-6, fragments=2)
    with pytest.raises(ValueError, match="rappor_fragments only"):
        fragmented_privacy_report("rappor", 10, 1.0, 1000, 1e-6, epsilon_fragment=0.5)
    with pytest.raises(ValueError, match="one of grr, oue, olh, generic, rappor, rappor_fragments"):
        build_privacy_report("hadamard", 10, 1.0, 1000, 1e-6)
    with pytest.raises(ValueError, match="fragments must be an integer >= 1"):
        fragmented_privacy_report("rappor_fragments", 10, 1.0, 1000, 1e-6, fragments=0)
    with pytest.raises(ValueError, match="needs fragments"):
        fragmented_privacy_report("rappor_fragments", 10, 1.0, 1000, 1e-6)


RAPPOR_KEYS = {
    "mechanism", "domain", "neighbouring", "epsilon_local", "epsilon_local_replacement", "n", "delta", "alpha",
    "alpha_rule", "eps_central", "eps_central_rule", "eps_central_replacement_basic", "eps_central_removal",
    "eps_central_removal_rule", "eps_central_removal_tight",
    "expected_messages", "closed_forms",
}
FRAGMENT_KEYS = RAPPOR_KEYS | {
    "fragments", "epsilon_backstop", "epsilon_fragment", "epsilon_fragment_rule", "epsilon_one_fragment",
    "epsilon_exposed",
}


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["privacy", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_rappor_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "--mechanism", "rappor", "--domain", "87680", "--epsilon", "8.55", "--n", "1914589",
                        "--delta", "5e-8", "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report) == RAPPOR_KEYS
    assert report["mechanism"] == "rappor" and report["neighbouring"] == "replacement"
    assert report["eps_central_removal"] == pytest.approx(1.00177, rel=0.01)
    assert report["closed_forms"]["lemma_ii6"]["epsilon"] == report["eps_central_removal"]
    assert report["closed_forms"]["theorem_iii1"]["epsilon"] == pytest.approx(1.77283, abs=PRINTED)
    assert 0 < report["eps_central_removal_tight"] < report["eps_central_removal"]
    assert report["eps_central_removal_tight"] == rappor_tight(1_914_589, 8.55, 5e-8)
    assert report["eps_central_removal_tight"] < report["eps_central"] < 2 * report["eps_central_removal_tight"]
    assert report["alpha"] == pytest.approx(1 / (math.exp(8.55) + 1), rel=1e-12)
    assert report["epsilon_local_replacement"] == 17.1
    assert report["expected_messages"] == pytest.approx(17.97, abs=0.005)


def test_cli_rappor_fragments_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "--mechanism", "rappor_fragments", "--domain", "87680", "--epsilon", "2.94",
                        "--fragments", "4", "--epsilon-fragment", "1.5897", "--n", "1914589", "--delta", "5e-8",
                        "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report) == FRAGMENT_KEYS
    assert report["fragments"] == 4 and report["epsilon_fragment_rule"] == "given"
    assert report["epsilon_one_fragment"] == pytest.approx(1.369979, abs=1e-4)
    assert report["epsilon_local"] == pytest.approx(2.907865, abs=1e-4)
    assert len(report["epsilon_exposed"]) == 4
    assert report["eps_central_removal"] == pytest.approx(0.04992, abs=PRINTED)  # Lemma II.6 on the backstop
    assert report["eps_central_removal_tight"] == fragments_tight(1_914_589, 2.94, 1.5897, 4, 5e-8)
    # too large for an exact PLD: basic composition of the two bits at delta/2
    assert report["eps_central"] == 2 * fragments_tight(1_914_589, 2.94, 1.5897, 4, 2.5e-8)
    forms = report["closed_forms"]
    assert set(forms) == {"lemma_ii6", "theorem_iii1", "theorem_iv2", "fragment_rows"}
    assert forms["theorem_iv2"]["epsilon"] == theorem_iv2(1_914_589, 2.94, 1.5897, 4, 5e-8).epsilon


def test_cli_default_fragment_epsilon_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "--mechanism", "rappor_fragments", "--domain", "1000", "--epsilon", "4",
                        "--fragments", "16", "--n", "100000", "--delta", "1e-6", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["epsilon_fragment"] == default_fragment_epsilon(4.0, 16)
    assert report["epsilon_fragment_rule"].startswith("default")
    code, text, _ = _cli(capsys, "--mechanism", "rappor_fragments", "--domain", "1000", "--epsilon", "4",
                         "--fragments", "16", "--n", "100000", "--delta", "1e-6")
    assert code == 0 and text.strip() == format_privacy_report(report)
    assert "fragments tau    16" in text and "theorem_iv2" in text and "removal DP" in text
    code, text, _ = _cli(capsys, "--mechanism", "rappor", "--domain", "1000", "--epsilon", "4", "--n", "100000",
                         "--delta", "1e-6")
    assert code == 0 and "lemma_ii6" in text and "tight bound" in text


def test_cli_rejects_fragment_options_elsewhere(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "--mechanism", "grr", "--domain", "10", "--epsilon", "1", "--n", "1000", "--delta",
                        "1e-6", "--fragments", "3")
    assert code == 2 and "rappor_fragments only" in err


def _exact_channel_pair(n: int, alpha: float, eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """P and Q of the §1.2 pair over every outcome (m, x), from scipy.stats (not from the module tested)."""
    from scipy.stats import binom

    e_a, rest = math.exp(eps0) * alpha, 1.0 - alpha - math.exp(eps0) * alpha
    m, x = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    z = rest * binom.pmf(m, n - 1, 2 * alpha) * binom.pmf(x, m, 0.5)
    b = binom.pmf(m - 1, n - 1, 2 * alpha)
    with np.errstate(invalid="ignore"):
        one, two = np.nan_to_num(b * binom.pmf(x - 1, m - 1, 0.5)), np.nan_to_num(b * binom.pmf(x, m - 1, 0.5))
    valid = x <= m
    return (z + e_a * one + alpha * two)[valid], (z + alpha * one + e_a * two)[valid]


@pytest.mark.slow
def test_rappor_replacement_epsilon_within_1e_3_of_exact() -> None:
    """rappor's eps_central (two changed channels) against dp_accounting run directly on the exact pair law
    of one channel, composed twice, at n = 1151 (the odometer's 2% client grid would round it to 1129 and
    overstate by ~0.8%: the value must come from the exact n)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    n, eps, delta = 1151, 4.0, 1e-6
    alpha = 1.0 / (math.exp(eps) + 1.0)
    p, q = _exact_channel_pair(n, alpha, eps)
    keep = (p > 1e-40) | (q > 1e-40)
    log_p = {i: math.log(v) for i, v in enumerate(p[keep]) if v > 0}
    log_q = {i: math.log(v) for i, v in enumerate(q[keep]) if v > 0}
    channel = pld_lib.from_two_probability_mass_functions(log_q, log_p, value_discretization_interval=1e-6)
    exact = float(channel.compose(channel).get_epsilon_for_delta(delta))
    assert abs(replacement_tight(n, alpha, eps, delta) / exact - 1.0) < 1e-3
