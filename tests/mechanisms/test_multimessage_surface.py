"""The multi-message contract of base.py for the [MultiMsg] protocols: parameters, draws, messages, accumulators."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from transforms.mechanisms.base import channel_count, encode_messages, is_single_message, messages_per_channel
from transforms.mechanisms.multimessage.common import check_sets, parity
from transforms.mechanisms.multimessage.protocols import CountMinMultiRR, MultiMessageHadamard, kernel_items
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng

HR = MultiMessageHadamard(100, 1.0, 1e-6, n_expected=5000)
CM = CountMinMultiRR(100, 4.0, 1e-6, n_expected=2000, rows=6)
MECHS = [HR, CM, MultiMessageHadamard(50, 2.0, 1e-6, n_expected=3000, k_set=3),
         CountMinMultiRR(50, 4.0, 1e-6, n_expected=2000, k_set=2, rows=5)]


@pytest.mark.parametrize("mech", MECHS, ids=repr)
def test_contract(mech: MultiMessageHadamard | CountMinMultiRR) -> None:
    assert not is_single_message(mech) and channel_count(mech) == 1
    values = seeded_rng(1).integers(0, mech.d, 3000)
    sets = check_sets(values, mech.d, mech.k_set)
    reports, owner = encode_messages(mech, values, seeded_rng(2)) if mech.k_set == 1 else \
        mech.encode_sets(sets, seeded_rng(2))
    assert reports.dtype == mech.report_dtype and mech.validate(reports).all()
    assert np.all(np.diff(owner) >= 0) and owner.max() < len(values)  # one client's messages are consecutive
    per_client = np.bincount(owner, minlength=len(values))
    assert per_client.max() <= messages_per_channel(mech)
    ledger = mech.ledger()
    assert ledger["messages_per_client_max"] == messages_per_channel(mech)
    assert abs(per_client.mean() - ledger["messages_per_client_expected"]) < 0.05 * per_client.mean()
    assert ledger["epsilon_numeric"] <= mech.epsilon and ledger["delta_numeric"] <= mech.delta
    assert mech.epsilon_central(mech.n_expected, mech.delta) <= mech.epsilon
    assert mech.epsilon_central(mech.n_expected // 4, mech.delta) > mech.epsilon  # fewer clients: less privacy
    assert mech.epsilon_local == float("inf")


@pytest.mark.parametrize("mech", MECHS, ids=repr)
def test_keyed_randomness_is_batch_independent(mech: MultiMessageHadamard | CountMinMultiRR) -> None:
    values = seeded_rng(3).integers(0, mech.d, 300)
    sets = check_sets(values, mech.d, mech.k_set)
    ids = np.arange(300, dtype=np.uint64)
    key = job_key_from_seed(4)
    whole, owner = mech.encode_sets(sets, KeyedRandom.for_elements(key, ids))
    parts = [mech.encode_sets(sets[s], KeyedRandom.for_elements(key, ids[s])) for s in (slice(0, 77), slice(77, 300))]
    assert np.array_equal(whole, np.concatenate([p[0] for p in parts]))
    assert np.array_equal(owner, np.concatenate([parts[0][1], parts[1][1] + 77]))


@pytest.mark.parametrize("mech", MECHS, ids=repr)
def test_accumulators(mech: MultiMessageHadamard | CountMinMultiRR) -> None:
    values = seeded_rng(5).integers(0, mech.d, 2000)
    reports, owner = mech.encode_sets(check_sets(values, mech.d, mech.k_set), seeded_rng(6))
    acc = mech.new_accumulator()
    with pytest.raises(ValueError, match="clients"):
        acc.add(reports)
    cut = int(np.searchsorted(owner, 700))
    acc.add(reports[:cut], 700)
    other = mech.new_accumulator()
    other.add(reports[cut:], 1300)
    acc.merge(other)
    whole = mech.new_accumulator()
    whole.add(reports, 2000)
    assert acc.n == whole.n == 2000 and np.array_equal(acc.counts, whole.counts)
    result = acc.estimate()
    assert result.n == 2000 and result.count.shape == result.stderr.shape == (mech.d,)
    np.testing.assert_allclose(result.frequency, result.count / 2000)
    bad = reports[:3].copy()
    bad["channel"][0] = 1
    assert not mech.validate(bad)[0] and mech.validate(bad)[1:].all()
    with pytest.raises(ValueError, match="outside"):
        whole.add(bad, 1)
    with pytest.raises(ValueError, match="merge"):
        acc.merge(type(mech)(**{**mech.__getstate__(), "epsilon": mech.epsilon + 1}).new_accumulator())


@pytest.mark.parametrize("mech", MECHS, ids=repr)
def test_pickle_keeps_calibrated_parameters(mech: MultiMessageHadamard | CountMinMultiRR) -> None:
    again = pickle.loads(pickle.dumps(mech))
    assert again == mech and again.parameters() == mech.parameters()
    assert type(mech)(**mech.__getstate__()) == mech  # explicit parameters rebuild the same mechanism


def test_parameters_and_errors() -> None:
    assert HR.tau == 12 and HR.order == 128 and HR.message_bits == 12 * 7
    assert HR.rho < MultiMessageHadamard(100, 1.0, 1e-6, n_expected=5000, calibration="paper").rho == 534
    assert CM.buckets == 4000 and CM.paper_gamma > 1
    with pytest.raises(ValueError, match="infeasible"):
        CountMinMultiRR(100, 1.0, 1e-6, n_expected=2000, calibration="paper")
    for bad in ({"delta": 0.0}, {"delta": 1.5}, {"n_expected": 1}, {"k_set": 0}, {"rho": 0}, {"tau": 0},
                {"calibration": "guess"}):
        with pytest.raises(ValueError):
            MultiMessageHadamard(**{"d": 10, "epsilon": 1.0, "delta": 1e-6, "n_expected": 100, **bad})
    for bad in ({"gamma": 0.0}, {"gamma": 1.5}, {"rows": 0}, {"buckets": 1}, {"estimator": "max"}, {"beta": 1.0}):
        with pytest.raises(ValueError):
            CountMinMultiRR(**{"d": 10, "epsilon": 1.0, "delta": 1e-6, "n_expected": 100, "gamma": 0.1, **bad})
    with pytest.raises(ValueError, match="twice"):
        check_sets(np.array([[1, 1]]), 5, 2)
    with pytest.raises(ValueError, match="outside"):
        HR.encode_messages(np.array([100]), seeded_rng(0))


def test_kernel_decoding_matches_definition() -> None:
    rng = seeded_rng(17)
    for bits, tau, d in [(4, 1, 13), (5, 3, 30), (7, 2, 100), (11, 13, 1024), (3, 5, 6), (6, 8, 40)]:
        u = rng.integers(0, 1 << bits, (600, tau))
        j = np.arange(d)
        inside = np.all(parity(u[:, :, None] & (j + 1)[None, None, :]) == 0, axis=1)
        np.testing.assert_array_equal(np.sort(kernel_items(u, bits, d)), np.sort(np.nonzero(inside)[1]))


def test_hadamard_data_messages_support_their_item() -> None:
    mech = MultiMessageHadamard(30, 1.0, 1e-6, n_expected=200, rho=2)
    values = np.arange(200) % 30
    reports, _ = mech.encode_messages(values, seeded_rng(18))
    data = reports["values"].reshape(200, mech.messages_per_client, mech.tau_)[:, 0, :]
    assert np.all(parity(data & (values + 1)[:, None]) == 0)


def test_countmin_messages() -> None:
    mech = CountMinMultiRR(40, 4.0, 1e-6, n_expected=500, rows=3, buckets=50, gamma=0.1)
    reports, owner = mech.encode_messages(np.full(4000, 7), seeded_rng(19))
    per_client = np.bincount(owner, minlength=4000)
    blanket = per_client - mech.rows_
    assert abs(blanket.mean() - mech.cells * mech.gamma_) < 4 * np.sqrt(mech.cells * 0.09 / 4000)
    cells = reports["seed"].astype(np.int64) * mech.buckets_ + reports["z"]
    data_cells = mech.hash_table[:, 7] + np.arange(mech.rows_) * mech.buckets_
    freq = np.bincount(cells, minlength=mech.cells) / 4000
    expected = np.full(mech.cells, mech.gamma_)
    expected[data_cells] += 1
    assert np.max(np.abs(freq - expected)) < 5 * np.sqrt(0.09 / 4000)
    capped = CountMinMultiRR(40, 4.0, 1e-6, n_expected=500, rows=3, buckets=50, gamma=0.1, max_blanket=5)
    _, owner = capped.encode_messages(np.full(4000, 7), seeded_rng(20))
    assert np.bincount(owner).max() == capped.messages_per_channel == 3 + 5
