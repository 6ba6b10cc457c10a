"""The key-value client encoder (``transforms.mechanisms.keyvalue.kv_encoding``): domain errors (dead-letter reasons),
unbiased stochastic discretisation with variance 1 - u^2, padding, and uniform key sampling with keep
probability s/max_keys (the estimator's correction factor; end-to-end checks in test_collision_stats.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from transforms.mechanisms.keyvalue.collision import Collision
from transforms.mechanisms.keyvalue.collision_common import check_sparse_items
from transforms.mechanisms.keyvalue.kv_encoding import KeyValueEncoder, discretisation_variance_bound, discretise
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_seed, seeded_rng

KEYS = ("cpu", "mem", "disk", "net", "gpu")


def encoder(**kwargs: object) -> KeyValueEncoder:
    return KeyValueEncoder(KEYS, 2, (0.0, 100.0), **kwargs)  # type: ignore[arg-type]


def test_construction_is_validated() -> None:
    for kwargs in ({"keys": ()}, {"keys": ("a", "a")}, {"keys": ("a", "")}, {"s": 0}, {"s": 6},
                   {"value_range": (1.0, 1.0)}, {"value_range": (0.0, math.inf)}, {"max_keys": 1}):
        args = {"keys": KEYS, "s": 2, "value_range": (0.0, 100.0), **kwargs}
        with pytest.raises(ValueError):
            KeyValueEncoder(**args)  # type: ignore[arg-type]
    assert encoder().max_keys == 2 and encoder(max_keys=4).keep_probability == 0.5
    mech = Collision(5, 2, 1.0, max_keys=3)
    assert KeyValueEncoder.for_mechanism(mech, KEYS, (0.0, 100.0)).max_keys == 3
    with pytest.raises(ValueError):
        KeyValueEncoder.for_mechanism(mech, KEYS[:4])


@pytest.mark.parametrize(("event", "reason"), [
    ({"cpu": 1.0, "mem": 99}, None),
    ({}, None),
    ({"cpu": 0.0, "gpu": 100.0}, None),  # both ends of the range are inside
    ({"cpux": 1.0}, "unknown key 'cpux'"),
    ({"cpu": float("nan")}, "not finite"),
    ({"cpu": float("-inf")}, "not finite"),
    ({"cpu": 100.5}, "outside value_range"),
    ({"cpu": -1}, "outside value_range"),
    ({"cpu": "7"}, "not a number"),
    ({"cpu": True}, "not a number"),
    ({"cpu": 1, "mem": 2, "disk": 3}, "more than max_keys = 2"),
    ([("cpu", 1.0)], "must be a mapping"),
])
def test_event_errors(event: object, reason: str | None) -> None:
    got = encoder().event_error(event)
    assert got is None if reason is None else reason in str(got)
    if reason is not None:
        with pytest.raises(ValueError, match=r"event 1: "):
            encoder().to_padded([{"cpu": 1.0}, event])


def test_clip_accepts_out_of_range_values() -> None:
    enc = encoder(clip=True)
    assert enc.event_error({"cpu": 250.0}) is None
    assert enc.event_error({"cpu": float("nan")}) is not None  # clipping never hides a non-finite value
    np.testing.assert_array_equal(enc.normalise(np.array([-50.0, 0.0, 50.0, 250.0])), [-1.0, -1.0, 0.0, 1.0])


def test_row_errors_agree_with_event_errors() -> None:
    rng = np.random.default_rng(0)
    enc = encoder(max_keys=3)
    k = rng.integers(-1, 5, (400, 4))
    v = rng.uniform(-20, 120, (400, 4))
    v[rng.random((400, 4)) < 0.05] = np.nan
    reasons = enc.row_errors(k, v)
    for i in range(400):
        present = k[i] >= 0
        keys = [KEYS[j] for j in k[i][present]]
        if len(set(keys)) < len(keys):
            assert reasons[i] is not None  # a dict cannot hold a key twice: padded arrays can
            continue
        expected = enc.event_error(dict(zip(keys, v[i][present].tolist(), strict=True)))
        assert (reasons[i] is None) == (expected is None), (k[i], v[i], reasons[i], expected)
    assert enc.row_errors(np.array([[7, -1]]), np.zeros((1, 2)))[0] == "key index 7 outside [0, 5)"
    assert enc.row_errors(np.array([[-3, -1]]), np.zeros((1, 2)))[0] == "key index -3 outside [0, 5)"
    with pytest.raises(TypeError):
        enc.row_errors(np.zeros((1, 2)), np.zeros((1, 2)))
    with pytest.raises(ValueError, match="row 0: key 'cpu' listed twice"):
        enc.encode_padded(np.array([[0, 0]]), np.array([[1.0, 2.0]]), seeded_rng(0))


def test_encode_padded_layout() -> None:
    enc = encoder()
    rng = seeded_rng(1)
    k = np.array([[0, 4, -1, -1], [-1, -1, 2, -1], [-1, -1, -1, -1], [3, -1, -1, 1]])
    v = np.array([[0.0, 100.0, np.nan, np.nan], [np.nan, np.nan, 50.0, np.nan], [np.nan] * 4, [100.0, 0, 0, 0.0]])
    items = enc.encode_padded(k, v, rng)  # wider than max_keys: keys move left, padding columns are dropped
    assert items.shape == (4, 2)
    np.testing.assert_array_equal(items[0], [0, 9])  # value lo -> always -1 (item 2j), hi -> always +1 (2j + 1)
    assert items[1, 0] in (4, 5) and items[1, 1] == -1
    np.testing.assert_array_equal(items[2], [-1, -1])
    np.testing.assert_array_equal(items[3], [7, 2])
    check_sparse_items(items, len(KEYS), 2)
    narrow = enc.encode_padded(np.array([[1]]), np.array([[100.0]]), rng)  # narrower: padded to max_keys
    np.testing.assert_array_equal(narrow, [[3, -1]])
    events = [{"cpu": 0.0, "gpu": 100.0}, {}, {"mem": 100.0}]
    np.testing.assert_array_equal(enc.encode_events(events, rng), [[0, 9], [-1, -1], [3, -1]])


def test_discretisation_is_unbiased_with_variance_one_minus_u_squared() -> None:
    draws = 200_000
    rng = seeded_rng(2)
    u = np.linspace(-1.0, 1.0, 9)
    signs = discretise(np.broadcast_to(u, (draws, u.size)), rng.random((draws, u.size)))
    assert set(np.unique(signs)) <= {-1, 1}
    var = 1.0 - u**2
    z = (signs.mean(axis=0) - u) / np.sqrt(np.maximum(var, 1e-12) / draws)
    assert np.max(np.abs(z)) < 4.5
    np.testing.assert_allclose(signs.var(axis=0), var, atol=0.01)
    np.testing.assert_array_equal(discretisation_variance_bound(np.array([-0.1, 0.5, 2.0]), 10), [0.0, 0.05, 0.1])


def test_encoder_discretises_real_values_without_bias() -> None:
    draws = 100_000
    enc = encoder()
    items = enc.encode_padded(np.tile([[1, 3]], (draws, 1)), np.tile([[25.0, 90.0]], (draws, 1)), seeded_rng(3))
    for col, (key, value) in enumerate(((1, 25.0), (3, 90.0))):
        assert np.all(items[:, col] >> 1 == key)
        u = 2 * value / 100.0 - 1
        signs = 2 * (items[:, col] & 1) - 1
        assert abs(signs.mean() - u) < 4.5 * math.sqrt((1 - u * u) / draws)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_sampling_keeps_every_key_with_probability_s_over_max_keys(size: int) -> None:
    draws = 60_000
    enc = KeyValueEncoder(KEYS, 2, (0.0, 100.0), max_keys=5)
    k = np.tile(np.r_[np.arange(size), -np.ones(5 - size, dtype=int)], (draws, 1))
    v = np.where(k >= 0, 100.0, np.nan)  # value hi: every kept item is 2j + 1
    items = enc.encode_padded(k, v, seeded_rng(10 + size))
    assert items.shape == (draws, 2) and np.all((items == -1) | (items & 1 == 1))
    kept = np.stack([(items >> 1 == j).any(axis=1) for j in range(size)], axis=1).mean(axis=0)
    se = math.sqrt(0.4 * 0.6 / draws)
    assert np.max(np.abs(kept - 0.4)) < 4.5 * se  # s / max_keys = 2/5, whatever the event size
    assert np.all((items >= 0).sum(axis=1) <= min(size, 2))


def test_keyed_encoding_is_batch_independent() -> None:
    enc = KeyValueEncoder(KEYS, 2, (0.0, 100.0), max_keys=4)
    rng = np.random.default_rng(4)
    k = np.stack([np.r_[rng.choice(5, 3, replace=False), -1] for _ in range(40)])
    v = np.where(k >= 0, rng.uniform(0, 100, k.shape), np.nan)
    key, ids = job_key_from_seed(3), np.arange(40, dtype=np.uint64)
    whole = enc.encode_padded(k, v, KeyedRandom.for_elements(key, ids))
    parts = np.concatenate([enc.encode_padded(k[a:b, :3], v[a:b, :3], KeyedRandom.for_elements(key, ids[a:b]))
                            for a, b in ((0, 13), (13, 40))])  # narrower batch arrays: same draws per client
    np.testing.assert_array_equal(whole, parts)


def test_denormalise_inverts_normalise() -> None:
    enc = encoder()
    values = np.array([0.0, 12.5, 50.0, 100.0])
    back, se = enc.denormalise(enc.normalise(values), np.array([0.1, 0.2, 0.3, 0.4]))
    np.testing.assert_allclose(back, values)
    assert se is not None
    np.testing.assert_allclose(se, [5.0, 10.0, 15.0, 20.0])
