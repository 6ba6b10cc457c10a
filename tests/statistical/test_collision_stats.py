"""Unbiasedness and closed-form variance of Collision and CoCo (Monte-Carlo, docs/mathematics.md §3.1-3.2), the
finite seed family's bias term (``collision_common``), and the key-value encoder end to end (sampling correction).

Fixed seeds throughout. "Exact expectation under the family": the decoders are linear in the counts, so decoding
``n * sum_rows weight * exact_output_distribution(row)`` gives ``E[estimate | seed family]`` exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.statistical.stats_helpers import Z_MAX, assert_mean, assert_summed_variance
from transforms.mechanisms.keyvalue.collision import CoCo, Collision
from transforms.mechanisms.keyvalue.kv_encoding import KeyValueEncoder
from transforms.mechanisms.randomness import seeded_rng

pytestmark = pytest.mark.slow

Mech = Collision | CoCo
# Z_MAX (stats_helpers): Bonferroni over <= 3 x 2d coordinates: P(max |z| > 4.5) < 60 * 6.8e-6 ~ 4e-4


def distinct_rows(d: int, s: int, count: int, seed: int, max_empty: int) -> np.ndarray:
    """``count`` distinct rows over Zipf-popular keys with <= ``max_empty`` empty slots (short rows)."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, d + 1)
    rows: set[tuple[int, ...]] = set()
    while len(rows) < count:
        size = s - int(rng.integers(0, max_empty + 1))
        keys = rng.choice(d, size, replace=False, p=w / w.sum())
        signs = (rng.random(size) < 0.25 + 0.5 * (keys % 2)).astype(int)
        rows.add(tuple(sorted(2 * keys + signs)) + (-1,) * (s - size))
    return np.array(sorted(rows))


def truth_of(rows: np.ndarray, weights: np.ndarray, d: int) -> np.ndarray:
    f = np.zeros(2 * d)
    for row, w in zip(rows, weights, strict=True):
        f[row[row >= 0]] += w
    return f


def exact_expectation(mech: Mech, rows: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    counts = sum(w * n * mech.exact_output_distribution(r) for r, w in zip(rows, weights, strict=True))
    return mech.decode_counts(np.asarray(counts).reshape(mech.seed_family, mech.cells), n).frequency


def moments(freq: np.ndarray) -> np.ndarray:
    """Stack item frequencies [2d], means [d] and non-missing frequencies [d] along the last axis."""
    plus, minus = freq[..., 1::2], freq[..., 0::2]
    return np.concatenate([freq, plus - minus, plus + minus], axis=-1)


def closed_form(mech: Mech, freq: np.ndarray, n: int) -> np.ndarray:
    """Sampling variances (fully random hash) of :func:`moments` at true frequencies."""
    item = mech.variance(freq * n, n) / n**2
    if isinstance(mech, CoCo):
        vm, vn, _ = mech.moment_variances(freq[1::2], freq[0::2], n)
    else:
        vm = vn = item[1::2] + item[0::2]
    return np.concatenate([item, vm, vn])


def run(mech: Mech, items: np.ndarray, runs: int, seed: int, **kw: str) -> np.ndarray:
    rng = seeded_rng(seed)
    reports = mech.encode(np.tile(items, (runs, 1)), rng)
    n, out = items.shape[0], []
    for r in range(runs):
        acc = mech.new_accumulator()
        acc.add(reports[r * n:(r + 1) * n])
        out.append(acc.estimate(**kw).frequency)
    return np.array(out)




CASES = [
    (Collision(10, 3, 1.0, seed_family=64), 2),
    (Collision(8, 2, 2.0, t_rule="paper", seed_family=64), 1),
    (CoCo(10, 3, 1.0, seed_family=32), 1),
    (CoCo(12, 4, 0.5, t_rule="paper", seed_family=16), 1),
]


@pytest.mark.parametrize(("mech", "max_empty"), CASES, ids=[repr(c[0]) for c in CASES])
def test_encode_decode_match_the_exact_expectation_and_closed_form_variance(mech: Mech, max_empty: int) -> None:
    """A small family, so its bias is large: runs centre on the exact expectation *given the family*, and their
    spread is the closed form (signed family deviations cancel in the sum over coordinates)."""
    n, runs = 3000, 400
    rows = distinct_rows(mech.d, mech.s, 12, seed=mech.d, max_empty=max_empty)
    weights = np.random.default_rng(1).dirichlet(np.ones(len(rows)))
    multiplicity = np.floor(weights * n).astype(int)
    multiplicity[0] += n - multiplicity.sum()
    weights = multiplicity / n
    truth = truth_of(rows, weights, mech.d)
    centre = moments(exact_expectation(mech, rows, weights, n))
    est = moments(run(mech, np.repeat(rows, multiplicity, axis=0), runs, seed=mech.cells))
    var = closed_form(mech, truth, n)
    assert_mean(est, centre, var, repr(mech))
    assert np.max(np.abs(centre - moments(truth)) / np.sqrt(var / runs)) > Z_MAX  # the family bias is visible
    k = 2 * mech.d
    assert_summed_variance(est[:, :k], centre[:k], var[:k].sum(), f"{mech!r} items")
    assert_summed_variance(est[:, k:k + mech.d], centre[k:k + mech.d], var[k:k + mech.d].sum(), f"{mech!r} means")


@pytest.mark.parametrize("mech", [Collision(10, 3, 1.0, seed_family=2**15), CoCo(10, 3, 1.0, seed_family=2**15)],
                         ids=repr)
def test_unbiased_for_the_truth_with_a_large_family(mech: Mech) -> None:
    n, runs = 1500, 250
    rows = distinct_rows(mech.d, mech.s, 60, seed=7, max_empty=1)
    items = rows[np.random.default_rng(2).integers(0, len(rows), n)]
    truth = truth_of(items, np.full(n, 1.0 / n), mech.d)
    acc = mech.new_accumulator()
    acc.add(mech.encode(items, seeded_rng(0)))
    assert acc.estimate().extras["family_share"] * runs < 0.05  # family bias negligible against SE / sqrt(runs)
    est = moments(run(mech, items, runs, seed=11))
    var = closed_form(mech, truth, n)
    assert_mean(est, moments(truth), var, repr(mech))
    assert_summed_variance(est[:, 2 * mech.d:3 * mech.d], moments(truth)[2 * mech.d:3 * mech.d],
                           var[2 * mech.d:3 * mech.d].sum(), f"{mech!r} means")


@pytest.mark.parametrize("cls", [Collision, CoCo])
def test_family_bias_is_zero_on_average_and_its_spread_is_the_calibrated_formula(cls: type[Mech]) -> None:
    """Exact expectations under 120 families (hash_seed): unbiased over families; the mean squared bias of absent
    items matches the calibrated family variance (and not the uncalibrated linearisation); at n = 10^6 the bias
    dwarfs the sampling stderr while the published stderr (sampling + family) covers it."""
    d, s, families, n = 20, 3, 120, 10**6
    rows = np.array([[1, 4, 9], [0, 5, -1], [2, 7, 13]])
    weights = np.array([0.6, 0.25, 0.15])
    truth = truth_of(rows, weights, d)
    absent = truth == 0
    bias, predicted, z_sampling, z_reported = [], [], [], []
    for h in range(families):
        mech = cls(d, s, 1.0, seed_family=16, hash_seed=h)
        counts = sum(w * n * mech.exact_output_distribution(r) for r, w in zip(rows, weights, strict=True))
        est = mech.decode_counts(np.asarray(counts).reshape(mech.seed_family, mech.cells), n)
        bias.append(est.frequency - truth)
        sampling = np.sqrt(closed_form(mech, truth, n)[:2 * d])
        z_sampling.append(bias[-1] / sampling)
        z_reported.append(bias[-1] / est.frequency_stderr)
        if isinstance(mech, CoCo):
            fm, fn = mech.family_variances(np.sum((truth[1::2] - truth[0::2]) ** 2),
                                           np.sum((truth[1::2] + truth[0::2]) ** 2))
            predicted.append((fm + fn) / 4)
            rho = np.array(mech.family_factors)
            linear = (fm / rho[0] + fn / rho[1]) / 4
        else:
            predicted.append(mech.family_variance(np.sum(truth**2)))
            linear = predicted[-1] / mech.family_factor
    b = np.array(bias)
    z_mean = b.mean(axis=0) / (b.std(axis=0, ddof=1) / np.sqrt(families))
    assert np.max(np.abs(z_mean)) < Z_MAX  # unbiased over the random choice of family
    observed, calibrated = float(np.mean(b[:, absent] ** 2)), float(np.mean(predicted))
    assert abs(observed / calibrated - 1) < 0.15, (observed, calibrated)
    assert abs(observed / linear - 1) > 0.2  # the calibration factor matters at these sizes
    assert np.sqrt(np.mean(np.array(z_sampling)[:, absent] ** 2)) > 5  # textbook stderr: confidently wrong
    assert np.sqrt(np.mean(np.array(z_reported)[:, absent] ** 2)) < 1.2  # published stderr: honest


@pytest.mark.parametrize("cls", [Collision, CoCo])
def test_real_values_with_key_sampling_end_to_end(cls: type[Mech]) -> None:
    """Events with 1..4 real-valued keys, s = 2 of max_keys = 4 reported: the mechanism built with the same
    max_keys is unbiased for the real-valued means (missing = 0) and non-missing frequencies; one built for
    max_keys = s (no correction) shrinks them by s/L = 1/2; the variance is the mechanism's plus discretisation."""
    d, n, runs = 6, 1000, 300
    enc = KeyValueEncoder(tuple("abcdef"), 2, (0.0, 10.0), max_keys=4)
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 5, n)
    k = np.full((n, 4), -1)
    for i, size in enumerate(sizes):
        k[i, :size] = rng.choice(d, size, replace=False, p=np.arange(1, d + 1) / (d * (d + 1) / 2))
    u_true = np.linspace(-0.8, 0.6, d)
    v = np.where(k >= 0, 5.0 * (1 + u_true[np.maximum(k, 0)] + rng.uniform(-0.2, 0.2, k.shape)), np.nan)
    u = np.where(k >= 0, enc.normalise(np.nan_to_num(v)), 0.0)
    mean_true = np.array([u[k == j].sum() for j in range(d)]) / n
    present = np.array([(k == j).sum() for j in range(d)]) / n
    disc = np.array([(1 - u[k == j] ** 2).sum() for j in range(d)]) / n**2
    mech = cls(d, 2, 2.0, max_keys=4, seed_family=2**16)
    naive = cls(d, 2, 2.0, seed_family=2**16)
    encoder_rng = seeded_rng(6)
    items = np.concatenate([enc.encode_padded(k, v, encoder_rng) for _ in range(runs)])
    reports = mech.encode(items, seeded_rng(7))
    est, shrunk = [], []
    for r in range(runs):
        acc = mech.new_accumulator()
        acc.add(reports[r * n:(r + 1) * n])
        e = acc.estimate()
        est.append(np.concatenate([e.mean, e.nonmissing]))
        assert e.extras["family_share"] * runs < 0.1
        if r < 100:  # the decoder of a mechanism that does not know about the sampling
            e_raw = naive.decode_counts(acc.counts, n)
            shrunk.append(np.concatenate([e_raw.mean, e_raw.nonmissing]))
    f_plus, f_minus = (present + mean_true) / 2, (present - mean_true) / 2  # expected item frequencies
    if isinstance(mech, CoCo):
        vm, vn, _ = mech.moment_variances(f_plus, f_minus, n)
    else:
        item = mech.variance(np.stack([f_minus, f_plus], axis=1).ravel() * n, n) / n**2
        vm = vn = item[1::2] + item[0::2]
    target, var = np.concatenate([mean_true, present]), np.concatenate([vm + disc, vn])
    assert_mean(np.array(est), target, var, f"{mech!r} corrected")
    assert_mean(np.array(shrunk), target / 2, var / 4, f"{naive!r} uncorrected = (s/L) x truth")
    assert_summed_variance(np.array(est)[:, :d], mean_true, (vm + disc).sum(), f"{mech!r} means")
