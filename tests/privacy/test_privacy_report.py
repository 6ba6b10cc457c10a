"""The ``esa privacy`` report: keys, the right alpha per mechanism, JSON round trip, text rendering."""

from __future__ import annotations

import json
import math

import pytest

from transforms.privacy.mixture import alpha_generic, alpha_grr, alpha_olh, alpha_oue, olh_buckets
from transforms.privacy.report import (
    PRIVACY_MECHANISMS,
    format_privacy_report,
    mechanism_alpha,
    privacy_report,
)
from transforms.privacy.shuffle_bound import epsilon_central

KEYS = {
    "mechanism",
    "domain",
    "epsilon_local",
    "n",
    "delta",
    "alpha",
    "alpha_rule",
    "alpha_certified",
    "eps_central",
    "eps_central_bound",
    "eps_central_notion",
    "eps_central_generic",
    "eps_central_blanket",
    "blanket",
    "closed_forms",
}
CLOSED_FORMS = {"efmrtt19", "blanket_krr", "lemma_ii6", "theorem_iii1", "fmt21_clones", "lemma_ii5"}


def expected_alpha(mechanism: str, domain: int, eps: float) -> float:
    return {
        "grr": lambda: alpha_grr(eps, domain),
        "oue": lambda: alpha_oue(eps),
        "olh": lambda: alpha_olh(eps, max(2, round(math.exp(eps) + 1))),
        "generic": lambda: alpha_generic(eps),
    }[mechanism]()


@pytest.mark.parametrize("mechanism", PRIVACY_MECHANISMS)
def test_report_contents(mechanism: str) -> None:
    domain, eps, n, delta = 32, 1.5, 50_000, 1e-6
    report = privacy_report(mechanism, domain, eps, n, delta)
    assert set(report) == KEYS
    assert set(report["closed_forms"]) == CLOSED_FORMS
    assert report["alpha"] == expected_alpha(mechanism, domain, eps)
    assert report["alpha_certified"] == pytest.approx(alpha_generic(eps), rel=1e-15)  # §1.2: no leftover law
    assert report["eps_central_generic"] == epsilon_central(n, report["alpha"], eps, delta)
    # the published value is the smaller of the two valid bounds, and says which it is
    candidates = [report["eps_central_generic"]] + ([report["eps_central_blanket"]]
                                                    if report["eps_central_blanket"] is not None else [])
    assert report["eps_central"] == min(candidates)
    assert (report["eps_central_bound"] == "blanket pair") == (report["eps_central"] < report["eps_central_generic"])
    assert (report["blanket"] is None) == (mechanism in ("olh", "generic"))  # OLH's needs its family (the CLI's)
    assert 0.0 < report["eps_central"] < eps
    for form in report["closed_forms"].values():
        assert set(form) == {"epsilon", "reason"}
        assert (form["epsilon"] is None) != (form["reason"] is None)
    assert (
        report["closed_forms"]["lemma_ii5"]["reason"] == "asymptotic only (no constant); use the tight bound"
    )
    assert report["closed_forms"]["fmt21_clones"]["epsilon"] is not None
    assert report["closed_forms"]["efmrtt19"]["epsilon"] is None  # eps0 = 1.5 >= 1/2
    for name in ("lemma_ii6", "theorem_iii1"):
        assert "binary randomized response" in report["closed_forms"][name]["reason"]
    blanket = report["closed_forms"]["blanket_krr"]
    if mechanism in ("grr", "olh"):
        assert blanket["epsilon"] is not None and blanket["epsilon"] > report["eps_central"]
    else:
        assert blanket == {"epsilon": None, "reason": "applies to k-ary randomized response only"}
    assert json.loads(json.dumps(report)) == report


def test_report_uses_domain_for_grr_and_buckets_for_olh() -> None:
    grr = privacy_report("grr", 100, 2.0, 10**5, 1e-6)
    assert grr["alpha"] == alpha_grr(2.0, 100)
    assert "d=100" in grr["alpha_rule"]
    olh = privacy_report("olh", 100, 2.0, 10**5, 1e-6)
    assert olh["alpha"] == alpha_olh(2.0, 8)  # round(e^2 + 1) = round(8.39) = 8
    assert "g=8" in olh["alpha_rule"]


def test_olh_buckets() -> None:
    assert olh_buckets(2.0) == 8
    assert olh_buckets(1.0) == 4  # round(3.718)
    assert olh_buckets(0.1) == 2  # round(2.105)
    assert olh_buckets(0.01) == 2
    assert olh_buckets(5.0) == 149  # round(149.41)


def test_efmrtt19_appears_for_small_epsilon() -> None:
    report = privacy_report("generic", 2, 0.4, 10**4, 1e-4)
    assert report["closed_forms"]["efmrtt19"]["epsilon"] == pytest.approx(0.145673, abs=1e-6)


def test_format_privacy_report() -> None:
    report = privacy_report("grr", 64, 2.0, 10**5, 1e-6)
    text = format_privacy_report(report)
    assert "grr (domain 64)" in text
    assert f"{report['eps_central']:.6g}" in text
    for name in CLOSED_FORMS:
        assert name in text
    assert "n/a: applies to binary randomized response" in text


def test_report_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mechanism must be one of grr, oue, olh, generic"):
        privacy_report("rappor", 10, 1.0, 1000, 1e-6)
    with pytest.raises(ValueError, match="mechanism must be one of"):
        mechanism_alpha("hadamard", 10, 1.0)
    with pytest.raises(ValueError, match="domain must be an integer >= 2"):
        privacy_report("grr", 1, 1.0, 1000, 1e-6)
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        privacy_report("grr", 10, 1.0, 1, 1e-6)
    with pytest.raises(ValueError, match=r"delta must lie in \(0, 1\)"):
        privacy_report("grr", 10, 1.0, 1000, 0.0)
