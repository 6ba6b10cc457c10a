"""Permanent randomization: one backstop per (device, spec, value), reused across windows and restarts, and the
reports drawn from it follow the mechanism's exact conditional law."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from tests.device.helpers import T0, client_kwargs, histogram_spec, open_report
from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from transforms.device import Client, StateError
from transforms.mechanisms.frequency.unary_sampling import pattern_law

HOUR_MS = 3_600_000


def _fragment_sets(spec, data: bytes) -> list[list[int]]:
    """Per fragment, the sorted bits it reports (channel i*d + j is bit j of fragment i)."""
    _, rows = open_report(spec, data)
    d, tau = spec.randomizer.d, spec.randomizer.fragments
    channels = np.array([row[0] for row in rows[1:]], dtype=np.int64)
    return [sorted((channels[channels // d == i] % d).tolist()) for i in range(tau)]


def _stored(client: Client, value: int) -> list[int]:
    return json.loads(client._memo.path.read_text())["backstops"][str(value)]


def test_backstop_is_drawn_once_and_reused_across_windows_and_restarts(tmp_path):
    # eps_f = 15: a fragment copies its backstop bit except with probability 3e-7, so every report shows the backstop
    spec = histogram_spec("rappor_fragments", 1.0, d=8, fragments=2, epsilon_fragment=15.0)
    client = Client(spec, tmp_path, rng=np.random.default_rng(3), **client_kwargs())
    seen = [_fragment_sets(spec, client.encode(5, event_time_ms=int(T0 * 1000) + w * HOUR_MS)) for w in range(4)]
    backstop = _stored(client, 5)
    restarted = Client(spec, tmp_path, rng=np.random.default_rng(4), **client_kwargs())
    seen += [_fragment_sets(spec, restarted.encode(5, event_time_ms=int(T0 * 1000) + w * HOUR_MS)) for w in range(4, 8)]
    assert all(fragment == backstop for report in seen for fragment in report)
    assert restarted.memoized_values == 1 and _stored(restarted, 5) == backstop
    restarted.encode(2)
    assert restarted.memoized_values == 2 and _stored(restarted, 5) == backstop
    # fresh draws of the backstop vary (eps_b = 1), so without the memo the reports above would too
    mech = spec.randomizer
    fresh = {tuple(row[row < 8]) for row in mech.backstop_bits(np.full(8, 5), np.random.default_rng(0))}
    assert len(fresh) > 1


def _first_backstop(spec, state_dir, seed: int) -> list[int]:
    client = Client(spec, state_dir, rng=np.random.default_rng(seed), **client_kwargs())
    sets = _fragment_sets(spec, client.encode(5))
    assert all(fragment == sets[0] for fragment in sets)  # eps_f = 15: every fragment shows the backstop
    return sets[0]


COPY = {"epsilon_fragment": 15.0}


def test_a_spec_edit_outside_the_backstop_parameters_keeps_the_backstop(tmp_path):
    """[crowd] epsilon, lateness, window and the fragments (tau) do not change the backstop's law: a redraw would
    add a fresh eps_b of loss for nothing. (Keyed by the whole spec hash, each of these edits redrew it.)"""
    spec = histogram_spec("rappor_fragments", 1.0, d=8, fragments=2, **COPY)
    first = _first_backstop(spec, tmp_path, seed=1)
    edits = [dataclasses.replace(spec, crowd=dataclasses.replace(spec.crowd, epsilon=0.25)),
             dataclasses.replace(spec, allowed_lateness_seconds=600),
             histogram_spec("rappor_fragments", 1.0, d=8, fragments=3, window_seconds=86400, **COPY)]
    for seed, edited in enumerate(edits, start=2):
        assert edited.spec_id != spec.spec_id
        assert _first_backstop(edited, tmp_path, seed) == first
    assert len(list((tmp_path / "memo").glob("*.json"))) == 1


def test_a_new_backstop_law_or_another_metric_redraws(tmp_path):
    """Another eps_b or d has another law: the stored backstop must not be reused. Another metric is another
    value altogether. With eps_b = 1 and d = 8 two independent draws coincide with probability < 0.02 each."""
    spec = histogram_spec("rappor_fragments", 1.0, d=8, fragments=2, **COPY)
    first = _first_backstop(spec, tmp_path, seed=1)
    others = [histogram_spec("rappor_fragments", 1.5, d=8, fragments=2, **COPY),
              histogram_spec("rappor_fragments", 1.0, d=9, fragments=2, **COPY),
              histogram_spec("rappor_fragments", 1.0, d=8, fragments=2, name="other_metric", **COPY)]
    drawn = [_first_backstop(other, tmp_path, seed) for seed, other in enumerate(others, start=2)]
    assert len(list((tmp_path / "memo").glob("*.json"))) == 4
    assert sum(backstop != first for backstop in drawn) >= 2  # fails with probability ~1e-3 (and the seeds are fixed)
    for other in others:
        client = Client(other, tmp_path, **client_kwargs())
        assert client._memo.path != Client(spec, tmp_path, **client_kwargs())._memo.path


def test_a_store_keyed_by_the_old_spec_hash_is_adopted_not_redrawn(tmp_path):
    spec = histogram_spec("rappor_fragments", 1.0, d=8, fragments=2, **COPY)
    legacy = tmp_path / "memo" / f"{hashlib.sha256(spec.spec_id.encode()).hexdigest()[:24]}.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"format": 1, "spec_id": spec.spec_id, "mechanism": "rappor_fragments",
                                  "backstops": {"5": [0, 5, 7]}}))
    assert _first_backstop(spec, tmp_path, seed=1) == [0, 5, 7]
    edited = dataclasses.replace(spec, crowd=dataclasses.replace(spec.crowd, epsilon=0.25))
    assert _first_backstop(edited, tmp_path, seed=2) == [0, 5, 7]  # adopted into the new store at once


def test_a_corrupt_memo_is_refused_not_redrawn(tmp_path):
    spec = histogram_spec("rappor_fragments", 1.0, d=8, fragments=2)
    client = Client(spec, tmp_path, **client_kwargs())
    client.encode(3)
    store = json.loads(client._memo.path.read_text())
    store["backstops"]["3"] = [9]  # outside [0, d)
    client._memo.path.write_text(json.dumps(store))
    with pytest.raises(StateError, match="corrupt backstop"):
        client.encode(3)


def test_reports_from_the_stored_backstop_follow_the_exact_conditional_law(tmp_path):
    """Given the stored backstop b, each of the tau fragments reports bit j independently w.p. p_f if b_j else q_f
    (fragment_cap = d here: no truncation). 64 outcomes (tau d = 6 bits); 5 sigma per cell, Bonferroni: < 4e-5."""
    spec = histogram_spec("rappor_fragments", 1.0, d=3, fragments=2)
    mech = spec.randomizer
    assert mech.fragment_cap == mech.d
    client = Client(spec, tmp_path, rng=np.random.default_rng(11), **client_kwargs())
    draws = 2000
    patterns = np.zeros(draws, dtype=np.int64)
    for k in range(draws):
        _, rows = open_report(spec, client.encode(1, event_time_ms=k * HOUR_MS))
        for row in rows[1:]:
            patterns[k] |= 1 << int(row[0])  # bit i*d + j of the pattern is fragment i of bit j
    backstop = np.zeros(mech.d, dtype=bool)
    backstop[_stored(client, 1)] = True
    one_fragment = pattern_law(np.where(backstop, 1.0 - mech.q_fragment, mech.q_fragment))
    law = np.kron(one_fragment, one_fragment)  # fragment 1 occupies the high bits
    assert_counts_follow_law(np.bincount(patterns, minlength=law.size), law, draws, "conditional law")
