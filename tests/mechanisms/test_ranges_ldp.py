"""Exact LDP of a client's WHOLE message set in the dyadic range and rectangle mechanisms (docs/mathematics.md
§5), checked against encode; the per-message mixture alpha; KeyedRandom reproducibility; validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from transforms.mechanisms.frequency.linear_hashing import linear_hash
from transforms.mechanisms.randomness import KeyedRandom, seeded_rng
from transforms.mechanisms.ranges.dyadic import DyadicRange
from transforms.mechanisms.ranges.rectangles import DyadicRectangle

SEEDS = np.array([3, 2**40 + 17, 2**61 + 5, 123456789], dtype=np.int64)  # llh: data-independent seed set
CASES = [
    *(DyadicRange(3, eps, oracle="grr", levels=mode) for eps in (0.7, 2.0) for mode in ("sample", "all")),
    *(DyadicRange(3, 1.5, oracle="oue", levels=mode) for mode in ("sample", "all")),
    *(DyadicRange(3, 1.0, oracle="olh", levels=mode, seed_family=16) for mode in ("sample", "all")),
    *(DyadicRange(3, 2.0, oracle="llh", levels=mode) for mode in ("sample", "all")),
    DyadicRange(4, 2.0, oracle="grr", branching=4),
    DyadicRange(4, 3.0, oracle="llh", levels="all", prefix_lengths=(1, 4)),
]
TIGHT = ("grr", "oue")  # some pair of inputs attains e^eps exactly


def _table(m: DyadicRange) -> np.ndarray:
    seeds = SEEDS if m.oracle == "llh" else None
    return np.stack([m.exact_message_distribution(x, seeds) for x in range(m.d)])


@pytest.mark.parametrize("m", CASES, ids=repr)
def test_exact_ldp_of_whole_message_set(m: DyadicRange) -> None:
    table = _table(m)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, atol=1e-12)
    support = table > 0
    assert (support == support[0]).all()  # same support for every input (zero padding only)
    positive = table[:, support[0]]
    worst = float(np.max(positive[:, None, :] / positive[None, :, :]))
    assert worst <= math.exp(m.epsilon_local) * (1 + 1e-12)
    if m.oracle in TIGHT:
        assert worst == pytest.approx(math.exp(m.epsilon), rel=1e-12)


@pytest.mark.parametrize("m", CASES, ids=repr)
def test_mixture_alpha_bounds_every_message(m: DyadicRange) -> None:
    """mixture_alpha is per message (at epsilon_message): alpha >= max TV / (e^eps_msg - 1) on every level."""
    seeds = SEEDS if m.oracle == "llh" else None
    eps = m.epsilon_message
    assert m.prefix_lengths is not None
    for j, length in enumerate(m.prefix_lengths):
        laws = np.stack([m.oracles.exact_distribution(j, v, seeds) for v in range(1 << length)])
        tv = 0.5 * np.abs(laws[:, None] - laws[None, :]).sum(axis=-1)
        assert float(tv.max()) / math.expm1(eps) <= m.mixture_alpha * (1 + 1e-12)
    assert (1 + math.exp(eps)) * m.mixture_alpha <= 1 + 1e-12


def _outcome(m: DyadicRange, reports: np.ndarray) -> np.ndarray:
    """Index of each client's message set in the order of ``exact_message_distribution`` (grr/oue/olh)."""
    oracles, L = m.oracles, m.channels
    if m.oracle == "grr":
        y = reports["value"]
    elif m.oracle == "oue":
        bits = np.unpackbits(reports["bits"], axis=1, count=oracles.bit_length).astype(np.int64)
        y = bits @ (1 << np.arange(oracles.bit_length))
    else:
        y = reports["seed"] * oracles.buckets + reports["z"]
    sizes = [oracles.exact_distribution(j, 0).size for j in range(L)]
    if m.levels == "sample":
        return reports["channel"] * max(sizes) + y
    per_client = y.reshape(-1, L)
    index = np.zeros(len(per_client), dtype=np.int64)
    for j in range(L):
        index = index * sizes[j] + per_client[:, j]
    return index


@pytest.mark.parametrize("m", [CASES[i] for i in (0, 1, 4, 5, 6, 7, 10)], ids=repr)
def test_enumeration_matches_encode(m: DyadicRange) -> None:
    rng = seeded_rng(99)
    draws = 60_000
    table = _table(m)
    for x in range(m.d):
        reports, owner = m.encode_messages(np.full(draws, x), rng)
        assert m.validate(reports).all()
        assert np.array_equal(owner, np.repeat(np.arange(draws), 1 if m.levels == "sample" else m.channels))
        freq = np.bincount(_outcome(m, reports), minlength=table.shape[1])
        assert freq.size == table.shape[1]
        expected = draws * table[x]
        assert not freq[expected == 0].any()
        # z-test every outcome expected >= 25 times; pool the rare ones into one cell
        big = expected >= 25
        cells_f = np.append(freq[big], freq[~big].sum())
        cells_e = np.append(expected[big], expected[~big].sum())
        z = (cells_f - cells_e) / np.sqrt(np.maximum(cells_e * (1 - cells_e / draws), 1e-300))
        assert np.max(np.abs(z[cells_e > 0])) < 5, (x, np.max(np.abs(z)))


@pytest.mark.parametrize("m", [CASES[8], CASES[9], CASES[11]], ids=repr)
def test_llh_levels_match_encode(m: DyadicRange) -> None:
    """(channel, (z - H_seed(prefix)) mod g): levels uniform ("sample") or all present, offset 0 w.p. p."""
    rng = seeded_rng(5)
    draws, g = 40_000, m.oracles.buckets
    p, q = m.oracles.rr_form(0)[0], (1 - m.oracles.rr_form(0)[0]) / (g - 1)
    assert m.prefix_lengths is not None
    for x in (0, m.d - 1, m.d // 3):
        reports, _ = m.encode_messages(np.full(draws, x), rng)
        ch = reports["channel"]
        prefix = x >> (m.bits - np.asarray(m.prefix_lengths)[ch])
        offset = (reports["z"] - linear_hash(reports["seed"], prefix, g.bit_length() - 1)) % g
        law = np.full((m.channels, g), q)
        law[:, 0] = p
        law /= m.channels
        assert_counts_follow_law(np.bincount(ch * g + offset, minlength=law.size), law.ravel(), len(reports), x)


@pytest.mark.parametrize("oracle", ["grr", "oue", "olh", "llh"])
@pytest.mark.parametrize("mode", ["sample", "all"])
def test_keyed_randomness_is_batch_independent(oracle: str, mode: str) -> None:
    m = DyadicRange(6 if oracle != "oue" else 4, 2.0, oracle=oracle, levels=mode, seed_family=128)
    keys = np.arange(1, 301, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    values = seeded_rng(1).integers(0, m.d, 300)
    whole = m.encode(values, KeyedRandom(keys))
    parts = np.concatenate([m.encode(values[:77], KeyedRandom(keys[:77])),
                            m.encode(values[77:], KeyedRandom(keys[77:]))])
    assert np.array_equal(whole, parts)


def test_validate_rejects_out_of_domain_messages() -> None:
    rng = seeded_rng(4)
    grr = DyadicRange(3, 1.0, oracle="grr")
    good = grr.encode(np.arange(8), rng)
    bad = good.copy()
    bad["channel"][0] = 3
    bad["channel"][1], bad["value"][1] = 0, 2  # level 1 has 2 prefixes
    bad["value"][2] = -1
    assert grr.validate(good).all()
    assert grr.validate(bad)[:3].tolist() == [False, False, False]
    oue = DyadicRange(3, 1.0, oracle="oue")
    rep = oue.encode(np.arange(8), rng)
    rep["channel"] = 0
    rep["bits"][:, 0] = 0b00100000  # a bit beyond level 1's two items
    assert not oue.validate(rep).any()
    olh = DyadicRange(3, 1.0, oracle="olh", seed_family=16)
    rep = olh.encode(np.arange(8), rng)
    rep["seed"][0], rep["z"][1] = 16, olh.oracles.buckets
    assert olh.validate(rep).tolist() == [False, False] + [True] * 6
    assert not grr.validate(np.zeros(2, dtype=[("value", "<i8")])).any()
    acc = grr.new_accumulator()
    with pytest.raises(ValueError, match="outside the output domain"):
        acc.add(bad, 8)


def test_parameter_errors_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="levels must be one of"):
        DyadicRange(4, 1.0, levels="some")
    with pytest.raises(ValueError, match="power of two"):
        DyadicRange(4, 1.0, branching=3)
    with pytest.raises(ValueError, match="multiple of log2"):
        DyadicRange(5, 1.0, branching=4)
    with pytest.raises(ValueError, match="oracle 'oue' supports"):
        DyadicRange(16, 1.0, oracle="oue")
    with pytest.raises(ValueError, match="use oracle='llh'"):
        DyadicRange(16, 6.0, oracle="olh")
    with pytest.raises(ValueError, match="prefix_lengths"):
        DyadicRange(4, 1.0, prefix_lengths=(2, 3))
    with pytest.raises(ValueError, match="unknown oracle"):
        DyadicRange(4, 1.0, oracle="hadamard")


RECT_CASES = [DyadicRectangle(1, 2, 1.0, oracle="grr", levels=mode) for mode in ("sample", "all")]


@pytest.mark.parametrize("m", RECT_CASES, ids=repr)
def test_rectangle_message_set_ldp(m: DyadicRectangle) -> None:
    """The same enumeration for 2-D: (lx, ly) channels, one message or one per channel."""
    points = [(x, y) for x in range(2) for y in range(4)]
    laws = []
    for x, y in points:
        per = [m.oracles.exact_distribution(j, int(m.cells(np.array([[x, y]]), j)[0])) for j in range(m.channels)]
        if m.levels == "sample":
            width = max(p.size for p in per)
            laws.append(np.concatenate([np.pad(p, (0, width - p.size)) for p in per]) / m.channels)
        else:
            out = np.ones(1)
            for p in per:
                out = np.multiply.outer(out, p).ravel()
            laws.append(out)
    table = np.stack(laws)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, atol=1e-12)
    positive = table[:, table[0] > 0]
    worst = float(np.max(positive[:, None, :] / positive[None, :, :]))
    assert worst == pytest.approx(math.exp(m.epsilon), rel=1e-12)
    # and encode agrees with the channel layout: sample -> uniform channels, all -> every channel once
    reports, _ = m.encode_messages(np.array([[1, 3]] * 30_000), seeded_rng(8))
    per_channel = np.bincount(reports["channel"], minlength=m.channels)
    if m.levels == "all":
        assert (per_channel == 30_000).all()
    else:
        expected = 30_000 / m.channels
        assert np.max(np.abs(per_channel - expected)) < 5 * math.sqrt(expected)
