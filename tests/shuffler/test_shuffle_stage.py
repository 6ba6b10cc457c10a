"""The shuffler (transforms/shuffler/graph.py) on signed, sealed message sets: anonymity, dedupe, threshold, PRF.

Inputs are real ``MessageSet`` records of enrolled simulated devices (tests/transforms/release_inputs.py)
run through ``IngressFn`` + ``Shuffle`` on the FnApiRunner with ``drain=True``; DoFns are called directly
where one step is under test. Specs use GRR (d = 8), one-hour windows and a crowd threshold with
eps_cr = 1, delta_cr = 1e-6, i.e. T = (2/eps_cr) ln(2/delta_cr) = 29.017. The noise is the integer Laplace L
with q = exp(-eps_cr/2) = 0.6065, so a crowd of n >> T loses D = n - floor(n + L - T) = ceil(T) - L = 30 - L
sets. Pr[|L| >= 26] = 2 q^26/(1 + q) = 2.8e-6, so "D within 30 +- 25" fails by chance with probability
< 3e-6 per crowd (and the PRF key is fixed, so never in practice).
"""

from __future__ import annotations

import math
import pickle
from collections import Counter
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from tests.beam_harness import PipelineRun
from tests.transforms.release_inputs import (
    WIN_A,
    WIN_B,
    WINDOW_MS,
    Devices,
    make_spec,
    shuffle_run,
    sign_release,
)
from tests.transforms.release_inputs import decode_set as decode_message_set
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.privacy.crowd import crowd_threshold, discrete_laplace_scale, discrete_laplace_variance
from transforms.shuffler.graph import ReleasePart, discrete_laplace, noisy_crowd_target
from transforms.trust.release import ReleaseBatch, decode_release_batch

EPS_CR, DELTA_CR = 1.0, 1e-6
T = crowd_threshold(EPS_CR, DELTA_CR)  # 29.017
MAX_NOISE = 25  # see the module docstring
SPEC = make_spec()


def assert_deletions_plausible(deleted: int) -> None:
    assert math.ceil(T) - MAX_NOISE <= deleted <= math.ceil(T) + MAX_NOISE, deleted


def sealed_by_window(values: list[bytes]) -> dict[int, Counter]:
    """Sent sealed messages per window end (the shuffler cannot read them: blobs identify messages)."""
    out: dict[int, Counter] = {}
    for value in values:
        ms = decode_message_set(value)
        end = (ms.event_time_ms // WINDOW_MS + 1) * WINDOW_MS
        out.setdefault(end, Counter()).update(m.sealed for m in ms.messages)
    return out


# --- anonymity, dedupe, accounting --------------------------------------------------------------------------

class TwoWindows:
    """80 devices in window A, 60 of them again in window B, and three kinds of duplicate in window A."""

    def __init__(self, tmp_path: Path):
        self.devices = Devices.enrol(tmp_path / "keys", 80)
        d = self.devices
        self.records = d.crowd(SPEC, d.clients, WIN_A) + d.crowd(SPEC, d.clients[:60], WIN_B, partition=1)
        first = {r.offset: r for r in self.records if r.partition == 0}
        # c1: a byte-identical copy (a replay or a retried send), read later.
        self.replay = d.record(first[1].value)
        # c2: a second, later set in the same window (over the quota of 1).
        self.second = d.record(d.message_set(SPEC, "c2", WIN_A + WINDOW_MS - 1, [(5,)]))
        # c3: an *earlier* set that arrives later: it is kept and the first one is the duplicate.
        self.earlier = d.record(d.message_set(SPEC, "c3", WIN_A, [(6,)]))
        self.superseded = first[3]
        assert decode_message_set(self.superseded.value).event_time_ms > WIN_A
        self.records += [self.replay, self.second, self.earlier]
        self.run = shuffle_run(tmp_path, [SPEC], d, self.records)


@pytest.fixture(scope="module")
def two_windows(tmp_path_factory: pytest.TempPathFactory) -> TwoWindows:
    return TwoWindows(tmp_path_factory.mktemp("two_windows"))


def test_release_parts_carry_no_identity(two_windows: TwoWindows) -> None:
    parts = two_windows.run.values("released")
    assert parts
    # sets_in (released + deleted sets of the sub-crowd) stays inside the shuffler's domain: its staging and its
    # driver's accounting; a signed release batch has no such field (the next test pins the batch's fields).
    assert ReleasePart._fields == ("spec_id", "crowd_id", "window_end_ms", "subkey", "messages", "n_sets", "deleted",
                                   "sets_in")
    sets = [decode_message_set(r.value) for r in two_windows.records]
    for part in parts:
        assert type(part) is ReleasePart and part.spec_id == SPEC.spec_id and part.crowd_id is None
        assert part.deleted is None  # SPEC does not publish deletions
        assert part.sets_in is not None and part.sets_in >= part.n_sets
        assert all(isinstance(c, int) and isinstance(s, bytes) for c, s in part.messages)
        assert_no_identity(pickle.dumps(part), sets)


def assert_no_identity(data: bytes, sets: list) -> None:
    for ms in sets:
        for secret in (ms.device_id.encode(), bytes.fromhex(ms.device_id), ms.nonce, ms.signature,
                       ms.event_time_ms.to_bytes(8, "big"), str(ms.event_time_ms).encode()):
            assert secret not in data


def test_signed_release_batches_carry_no_identity(two_windows: TwoWindows) -> None:
    releases = sign_release(two_windows.devices.keys_dir, two_windows.run.values("released"), per_batch=20)
    sets = [decode_message_set(r.value) for r in two_windows.records]
    assert [f.name for f in fields(ReleaseBatch)] == [
        "release_id", "spec_id", "crowd_id", "window_end_ms", "batch_index", "batch_count", "n_sets", "n_messages",
        "deleted", "messages", "key_id", "signature"]
    for batches in releases.values():
        for data in batches:
            assert_no_identity(data, sets)
            batch = decode_release_batch(data)
            assert batch.crowd_id is None and batch.deleted is None and batch.window_end_ms % WINDOW_MS == 0


def test_each_window_releases_a_sub_multiset_of_its_own_messages(two_windows: TwoWindows) -> None:
    run = two_windows.run
    sent = sealed_by_window([r.value for r in two_windows.records])
    released: dict[int, Counter] = {}
    for part in run.values("released"):
        released.setdefault(part.window_end_ms, Counter()).update(s for _, s in part.messages)
    assert set(released) == {WIN_A + WINDOW_MS, WIN_B + WINDOW_MS}
    for end, n_devices in ((WIN_A + WINDOW_MS, 80), (WIN_B + WINDOW_MS, 60)):
        assert not released[end] - sent[end], "released a message that was never sent in this window"
        n_sets = sum(p.n_sets for p in run.values("released") if p.window_end_ms == end)
        assert n_sets == sum(released[end].values())  # one message per GRR set
        assert_deletions_plausible(n_devices - n_sets)


def test_one_set_per_device_and_window_with_reasons_that_name_no_device(two_windows: TwoWindows) -> None:
    t = two_windows
    dead = t.run.values("dead")
    # The byte-identical copy (a resend after a crash, or a replay) is counted as a duplicate, not dead-lettered:
    # it changes nothing, and a healthy rerun must not trip the dead-letter bar (issue 26, finding 11).
    assert sorted(d["offset"] for d in dead) == sorted([t.second.offset, t.superseded.offset])
    assert t.run.count("sets_duplicate") == 1
    by_offset = {d["offset"]: d for d in dead}
    assert "already sent 1 set" in by_offset[t.second.offset]["reason"]
    assert "duplicate" in by_offset[t.superseded.offset]["reason"]
    ids = {t.devices.device_id(c) for c in t.devices.clients} | set(t.devices.clients)
    for letter in dead:
        assert letter["stage"] == "shuffle" and letter["spec_id"] == SPEC.spec_id
        assert not any(i in letter["reason"] for i in ids)
    # The kept set of c3 is the earlier one: its message is released or deleted, never the superseded one's.
    released = {s for p in t.run.values("released") for _, s in p.messages}
    assert not {m.sealed for m in decode_message_set(t.superseded.value).messages} & released


def test_counters_account_for_every_set(two_windows: TwoWindows) -> None:
    run, n = two_windows.run, len(two_windows.records)
    assert run.count("sets_authenticated") == n
    assert run.count("dead_lettered") == 2 == len(run.values("dead")) and run.count("sets_duplicate") == 1
    assert run.count("sets_valid") == 140 and run.count("distinct_devices") == 140
    released = sum(p.n_sets for p in run.values("released"))
    assert run.count("sets_released") == released
    assert run.count("messages_released") == sum(len(p.messages) for p in run.values("released"))
    # read = dead-lettered + re-read + held + deleted + duplicate + released
    assert n == run.count("dead_lettered") + run.count("records_reread") + run.count("sets_held") \
        + run.count("sets_deleted") + run.count("sets_duplicate") + released
    assert run.count("crowds_released") == 2 and run.values("held") == []
    assert dict(run.values("times")) == {"reports/0": WIN_A + WINDOW_MS - 1, "reports/1": max(
        decode_message_set(r.value).event_time_ms for r in two_windows.records if r.partition == 1)}


# --- the permutation is a keyed PRF --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prf_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list, list]:
    tmp = tmp_path_factory.mktemp("prf")
    devices = Devices.enrol(tmp / "keys", 50)
    records = devices.crowd(SPEC, devices.clients, WIN_A)

    def parts(run: PipelineRun) -> list[ReleasePart]:
        return sorted(run.values("released"), key=lambda p: p.subkey)

    same = shuffle_run(tmp, [SPEC], devices, records, batch=7)
    # The same sets in another order and other bundles give the same release.
    again = shuffle_run(tmp, [SPEC], devices, records[::-1], batch=50)
    other = shuffle_run(tmp, [SPEC], devices, records, key=job_key_from_seed(8), batch=7)
    return parts(same), parts(again), parts(other)


def test_same_key_and_sets_give_an_identical_release(prf_runs: tuple[list, list, list]) -> None:
    same, again, _ = prf_runs
    assert same and same == again


def test_another_key_gives_another_release(prf_runs: tuple[list, list, list]) -> None:
    same, _, other = prf_runs
    assert other and [p.messages for p in other] != [p.messages for p in same]


@pytest.mark.parametrize("buckets", [1, 8])
def test_the_dedupe_bucket_count_changes_no_release(tmp_path: Path, two_windows: TwoWindows, buckets: int) -> None:
    """``ScaleOut`` gives a small run few dedupe buckets (the fixture's run has 64): the same releases, byte for
    byte, the same dead letters and counters, duplicates of one device meeting in whichever bucket holds it."""
    t = two_windows
    run = shuffle_run(tmp_path, [SPEC], t.devices, t.records, buckets=buckets)
    key = lambda p: (p.window_end_ms, p.subkey)  # noqa: E731
    fewer, default = sorted(run.values("released"), key=key), sorted(t.run.values("released"), key=key)
    assert fewer and [p._replace(messages=list(p.messages)) for p in fewer] == \
        [p._replace(messages=list(p.messages)) for p in default]
    assert sorted(run.values("dead"), key=lambda d: d["offset"]) == \
        sorted(t.run.values("dead"), key=lambda d: d["offset"])
    for name in ("sets_released", "sets_deleted", "sets_duplicate", "dead_lettered", "sets_valid", "distinct_devices"):
        assert run.count(name) == t.run.count(name), name


# --- crowd threshold -----------------------------------------------------------------------------------------

def test_a_crowd_below_the_threshold_releases_nothing(tmp_path: Path) -> None:
    # n = 12 << T = 29: a release needs floor(12 + L - T) >= 10 (min_clients), i.e. L >= 28: q^28/(1+q) = 5e-7.
    devices = Devices.enrol(tmp_path / "keys", 12)
    run = shuffle_run(tmp_path, [SPEC], devices, devices.crowd(SPEC, devices.clients, WIN_A))
    # Only empty parts leave (the driver seals the window as withheld from them): no message, no set.
    parts = run.values("released")
    assert parts and all(p.messages == () and p.n_sets == 0 for p in parts) and run.values("dead") == []
    assert run.count("sets_valid") == 12 and run.count("sets_deleted") == 12 and run.count("sets_released") == 0
    assert run.count("crowds_suppressed") == 1 and run.count("crowds_released") == 0


# --- the pure helpers: integer Laplace noise and n_hat ----------------------------------------------------------

DRAWS = 20_000


def exact_moments(eps: float) -> tuple[float, float, float]:
    """Mean, variance and 4th central moment of P(k) ∝ exp(-|k| eps/2), by summation over |k| <= 2000."""
    k = np.arange(-2000, 2001, dtype=np.float64)
    pmf = np.exp(-np.abs(k) * eps / 2.0)
    pmf /= pmf.sum()
    mean = float((k * pmf).sum())
    return mean, float(((k - mean) ** 2 * pmf).sum()), float(((k - mean) ** 4 * pmf).sum())


@pytest.mark.parametrize(("eps", "seed"), [(1.0, 101), (0.5, 102), (3.0, 103)])
def test_discrete_laplace_law(eps: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    draws = np.array([discrete_laplace(rng, eps) for _ in range(DRAWS)])
    assert draws.dtype.kind == "i"
    _, var, mu4 = exact_moments(eps)
    assert var == pytest.approx(discrete_laplace_variance(eps), rel=1e-9)
    # Mean 0: SE = sqrt(var/N). Variance: SE of the sample variance = sqrt((mu4 - var^2)/N). 4 SE each.
    assert abs(draws.mean()) < 4 * math.sqrt(var / DRAWS)
    assert abs(draws.var(ddof=1) - var) < 4 * math.sqrt((mu4 - var**2) / DRAWS)
    # The probability of every small value: binomial SE sqrt(p(1-p)/N), 4.5 SE (Bonferroni over 13 values).
    q = discrete_laplace_scale(eps)
    for value in range(-6, 7):
        p = (1 - q) / (1 + q) * q ** abs(value)
        assert abs(np.mean(draws == value) - p) < 4.5 * math.sqrt(p * (1 - p) / DRAWS), value


def test_deletion_count_moments_of_a_large_crowd() -> None:
    # D = n - n_hat for n = 3000 >> T + 10 (2/eps_cr): the clip at 0 never acts. Because n_hat is rounded down
    # and L is an integer, D = ceil(T) - L exactly: E[D] = ceil(T) = 30 and Var[D] = Var[L] = 2q/(1-q)^2 = 7.835
    # (the continuous Laplace's 8/eps_cr^2 = 8 is 2 % away at eps_cr = 1).
    rng = np.random.default_rng(2024)
    n = 3000
    deleted = np.array([n - noisy_crowd_target(n, discrete_laplace(rng, EPS_CR), T) for _ in range(DRAWS)])
    _, var, mu4 = exact_moments(EPS_CR)
    assert abs(deleted.mean() - math.ceil(T)) < 4 * math.sqrt(var / DRAWS)
    assert abs(deleted.var(ddof=1) - var) < 4 * math.sqrt((mu4 - var**2) / DRAWS)
    assert deleted.min() >= 0  # an abort needs L >= T + 1: q^31/(1+q) = 1.2e-7 per draw


@pytest.mark.parametrize(("n", "noise", "expected"), [
    (100, 0, 70),      # floor(100 - 29.017) = 70
    (100, 3, 73),
    (100, -3, 67),
    (29, 0, 0),        # floor(-0.017) = -1, clipped to 0
    (10, 20, 0),       # floor(0.98) = 0: still withheld
    (10, 21, 1),
    (0, 0, 0),
    (100, 31, 101),    # n_hat > n: the caller must abort, the helper does not clamp
])
def test_noisy_crowd_target(n: int, noise: int, expected: int) -> None:
    assert noisy_crowd_target(n, noise, T) == expected



def test_spilled_sets_and_units_release_exactly_what_in_memory_ones_do(tmp_path: Path,
                                                                       two_windows: TwoWindows) -> None:
    """The shuffle job spills its sets and units to files and groups references: same releases, byte for
    byte, same dead letters, same counters, and the files are where they were asked to be."""
    t = two_windows
    spill = tmp_path / "spill"
    run = shuffle_run(tmp_path, [SPEC], t.devices, t.records, spill=spill, spill_bytes=4000)
    key = lambda p: (p.window_end_ms, p.subkey)  # noqa: E731
    inline, spilled = sorted(t.run.values("released"), key=key), sorted(run.values("released"), key=key)
    assert [p._replace(messages=list(p.messages)) for p in spilled] == \
        [p._replace(messages=list(p.messages)) for p in inline]
    assert sorted(run.values("dead"), key=lambda d: d["offset"]) == \
        sorted(t.run.values("dead"), key=lambda d: d["offset"])
    for name in ("sets_released", "sets_deleted", "dead_lettered", "sets_valid", "distinct_devices"):
        assert run.count(name) == t.run.count(name), name
    assert len(list(spill.glob("*.spill"))) >= 3  # several ingress files (4,000-byte flushes), dedupe files
