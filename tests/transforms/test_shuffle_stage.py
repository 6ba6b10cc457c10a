"""The shuffler (DESIGN.md §5, transforms/shuffle.py): anonymity, crowd threshold, dedupe, windows, counters.

Inputs are ``ReportElement``s built directly; specs use a small GRR domain (d = 8), one-hour windows and a
crowd threshold with eps_cr = 1, delta_cr = 1e-6, i.e. T = (2/eps_cr) ln(2/delta_cr) = 29.017 (MECHANISMS.md
§11.5). The noise is the integer (two-sided geometric) Laplace L with q = exp(-eps_cr/2) = 0.6065, so the
number of deleted reports of a large crowd is D = n - floor(n + L - T) = ceil(T) - L = 30 - L.

Bounds used for single pipeline runs: Pr[|L| >= 26] = 2 q^26/(1 + q) = 2.8e-6, so "D within ceil(T) +- 25" fails
by chance with probability < 3e-6 per crowd (and the seeds are fixed, so never in practice).
"""

from __future__ import annotations

import itertools
import math
import pickle
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp
from fastavro.validation import validate

from schemas import SCHEMA_VERSION, encode_record, load_schema
from tests.beam_harness import PipelineRun, run_pipeline
from transforms.privacy.crowd import crowd_threshold, discrete_laplace_scale, discrete_laplace_variance
from transforms.records import ReportElement, ShuffledBatch, SourceRef, array_to_rows, payload_to_avro
from transforms.shuffle import Shuffle, discrete_laplace, noisy_crowd_target
from transforms.spec import AnalysisSpec, spec_from_dict


def shuffle_run(tmp_path: Path, spec: AnalysisSpec, reports: list[ReportElement], seed: int,
                batch_size: int = 4096) -> PipelineRun:
    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        released, dead = p | beam.Create(reports) | Shuffle(spec, seed=seed, batch_size=batch_size)
        return {"released": released, "dead": dead}

    return run_pipeline(tmp_path, build)


# --- specs and reports ------------------------------------------------------------------------------------

WINDOW_MS = 3_600_000
WIN_A = 472_222 * WINDOW_MS  # 2023-11-14T22:00Z, a window start
WIN_B = WIN_A + WINDOW_MS
EPS_CR, DELTA_CR = 1.0, 1e-6
T = crowd_threshold(EPS_CR, DELTA_CR)  # 29.017
MAX_NOISE = 25  # see the module docstring


def make_spec(mechanism: str = "grr", *, size: int = 8, subkeys: int = 4, quota: int = 1, crowd_delta: float = DELTA_CR,
              name: str = "shuffle_test") -> AnalysisSpec:
    return spec_from_dict({
        "analysis": {"name": name},
        "domain": {"size": size},
        "mechanism": {"name": mechanism, "epsilon": 1.0},
        "window": {"size_seconds": WINDOW_MS // 1000},
        "crowd": {"epsilon": EPS_CR, "delta": crowd_delta, "subkeys": subkeys},
        "clients": {"max_reports_per_window": quota},
    })


SPEC = make_spec()


class Population:
    """ReportElements with distinct, unguessable client ids and real Report bytes as ``original``."""

    def __init__(self, spec: AnalysisSpec, seed: int):
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.offsets = itertools.count(10)
        self.reports: list[ReportElement] = []

    def new_client(self) -> str:
        return "cid-" + self.rng.bytes(8).hex()

    def add(self, client: str, event_time_ms: int, payload: tuple, offset: int | None = None) -> ReportElement:
        offset = next(self.offsets) if offset is None else offset
        name, record = payload_to_avro(self.spec.randomizer, payload)
        original = encode_record("Report", {"schema_version": SCHEMA_VERSION, "spec_id": self.spec.spec_id,
                                            "channel": 0, "client_id": client, "event_time": event_time_ms,
                                            "payload": (name, record)})
        report = ReportElement(self.spec.spec_id, 0, client, event_time_ms, payload,
                               SourceRef("reports", 0, offset), original)
        self.reports.append(report)
        return report

    def crowd(self, n: int, window_start: int, values: np.ndarray | None = None) -> list[ReportElement]:
        """n new clients, one report each, event times spread over the window including both ends."""
        times = self.rng.integers(window_start, window_start + WINDOW_MS, size=n)
        times[:2] = [window_start, window_start + WINDOW_MS - 1][:n]
        if values is None:
            payloads = array_to_rows(self.spec.randomizer.encode(self.rng.integers(0, self.spec.d, n), self.rng))
        else:
            payloads = [(int(v),) for v in values]
        return [self.add(self.new_client(), int(t), p) for t, p in zip(times, payloads, strict=True)]


def released_rows(run: PipelineRun) -> list[tuple]:
    return [row for batch in run.values("released") for row in array_to_rows(batch.reports)]


def assert_sub_multiset(released: Iterable[tuple], inputs: Iterable[tuple]) -> None:
    extra = Counter(released) - Counter(inputs)
    assert not extra, f"released payloads that were never sent: {dict(extra)}"


def assert_deletions_plausible(deleted: int) -> None:
    assert math.ceil(T) - MAX_NOISE <= deleted <= math.ceil(T) + MAX_NOISE, deleted


# --- anonymity and windows -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[PipelineRun, Population, list, list]:
    # Window A's payloads are in {0..3} and window B's in {4..7}: a batch's contents prove its window.
    pop = Population(SPEC, seed=11)
    a = pop.crowd(400, WIN_A, values=pop.rng.integers(0, 4, 400))
    b = pop.crowd(300, WIN_B, values=pop.rng.integers(4, 8, 300))
    return shuffle_run(tmp_path_factory.mktemp("two_windows"), SPEC, pop.reports, seed=5), pop, a, b


def test_outputs_are_shuffled_batches_without_identity(two_windows: tuple[PipelineRun, Population, list, list]
                                                       ) -> None:
    run, pop, _, _ = two_windows
    batches = run.values("released")
    assert batches
    client_ids = [r.client_id.encode() for r in pop.reports]
    for batch in batches:
        assert type(batch) is ShuffledBatch
        # Payloads and the crowd's coordinates only; ``deleted`` is a count the spec may opt into publishing.
        assert ShuffledBatch._fields == ("spec_id", "crowd_id", "window_end_ms", "reports", "deleted")
        assert batch.spec_id == SPEC.spec_id and batch.crowd_id is None
        assert batch.deleted is None  # SPEC does not publish deletions
        assert batch.reports.dtype == SPEC.randomizer.report_dtype  # payload fields only
        data = pickle.dumps(batch)
        leaked = [c for c in client_ids if c in data]
        assert not leaked, f"client ids in a released batch: {leaked[:3]}"
        for report in pop.reports[:50]:  # nor the device's original bytes
            assert report.original not in data
    assert run.values("dead") == []


def test_every_batch_is_stamped_with_its_window(two_windows: tuple[PipelineRun, Population, list, list]) -> None:
    run, _, _, _ = two_windows
    ends = set()
    for observed in run.outputs["released"]:
        batch = observed.value
        assert batch.window_end_ms in (WIN_A + WINDOW_MS, WIN_B + WINDOW_MS)
        ends.add(batch.window_end_ms)
        # The element lives in its event-time window and carries the window's max timestamp (end - 1 us),
        # not any report's event time.
        assert (observed.window_start_us, observed.window_end_us) == ((batch.window_end_ms - WINDOW_MS) * 1000,
                                                                       batch.window_end_ms * 1000)
        assert observed.timestamp_us == batch.window_end_ms * 1000 - 1
        values = set(batch.reports["value"].tolist())
        expected = set(range(4)) if batch.window_end_ms == WIN_A + WINDOW_MS else set(range(4, 8))
        assert values <= expected, "a batch holds reports of another window"
    assert ends == {WIN_A + WINDOW_MS, WIN_B + WINDOW_MS}


def test_each_window_releases_a_sub_multiset_of_n_hat_reports(
        two_windows: tuple[PipelineRun, Population, list, list]) -> None:
    run, _, a, b = two_windows
    total_deleted = 0
    for inputs, end in ((a, WIN_A + WINDOW_MS), (b, WIN_B + WINDOW_MS)):
        rows = [row for batch in run.values("released") if batch.window_end_ms == end
                for row in array_to_rows(batch.reports)]
        assert_sub_multiset(rows, [r.payload for r in inputs])
        assert_deletions_plausible(len(inputs) - len(rows))
        total_deleted += len(inputs) - len(rows)
    assert run.count("reports_deleted") == total_deleted
    assert run.count("reports_released") == len(released_rows(run))
    assert run.count("crowds_released") == 2


# --- crowd threshold ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_crowd_below_the_threshold_releases_nothing(tmp_path: Path, seed: int) -> None:
    # n = 10 << T = 29: a release needs floor(10 + L - T) >= 1, i.e. L >= 21: probability q^21/(1+q) = 1.7e-5.
    pop = Population(SPEC, seed=seed)
    pop.crowd(10, WIN_A)
    run = shuffle_run(tmp_path, SPEC, pop.reports, seed=seed)
    assert run.values("released") == []
    assert run.values("dead") == []
    assert run.count("reports_valid") == 10
    assert run.count("reports_deleted") == 10
    assert run.count("reports_released") == 0
    assert run.count("crowds_suppressed") == 1 and run.count("crowds_released") == 0


@pytest.mark.parametrize("seed", [7, 8])
def test_a_large_crowd_loses_about_t_reports(tmp_path: Path, seed: int) -> None:
    pop = Population(SPEC, seed=seed)
    inputs = pop.crowd(3000, WIN_A)
    run = shuffle_run(tmp_path, SPEC, pop.reports, seed=seed, batch_size=128)
    rows = released_rows(run)
    deleted = len(inputs) - len(rows)
    assert_deletions_plausible(deleted)
    assert_sub_multiset(rows, [r.payload for r in inputs])
    assert all(len(batch.reports) <= 128 for batch in run.values("released"))
    assert run.count("reports_valid") == 3000
    assert run.count("reports_deleted") == deleted
    assert run.count("reports_released") == len(rows)
    assert run.count("crowds_released") == 1


@pytest.mark.parametrize(("mechanism", "size"), [("grr", 8), ("oue", 10), ("olh", 8)])
def test_released_payloads_are_a_sub_multiset_for_every_payload_kind(tmp_path: Path, mechanism: str,
                                                                     size: int) -> None:
    spec = make_spec(mechanism, size=size)
    pop = Population(spec, seed=21)
    inputs = pop.crowd(300, WIN_A)
    run = shuffle_run(tmp_path, spec, pop.reports, seed=4)
    assert all(b.reports.dtype == spec.randomizer.report_dtype for b in run.values("released"))
    rows = released_rows(run)
    assert_sub_multiset(rows, [r.payload for r in inputs])
    assert_deletions_plausible(300 - len(rows))
    assert spec.randomizer.validate(np.concatenate([b.reports for b in run.values("released")])).all()


def test_aborted_crowds_release_nothing_and_are_never_clamped(tmp_path: Path) -> None:
    # delta_cr = 0.9 gives T = 2 ln(2/0.9) = 1.597, so a crowd of 20 aborts (n_hat > n) when L >= 3: probability
    # q^3/(1+q) = 0.139 per crowd; over 50 crowds P[no abort] = 0.861^50 = 6e-4, and the seed is fixed (the
    # test asserts that the branch was exercised). Suppression needs L <= -18: 8e-5 per crowd.
    spec = make_spec(crowd_delta=0.9)
    pop = Population(spec, seed=17)
    starts = [WIN_A + k * WINDOW_MS for k in range(50)]
    for start in starts:
        pop.crowd(20, start)
    run = shuffle_run(tmp_path, spec, pop.reports, seed=17)
    released_windows = Counter(b.window_end_ms for b in run.values("released") for _ in range(len(b.reports)))
    assert run.count("crowds_aborted") >= 1
    assert run.count("crowds_released") + run.count("crowds_aborted") + run.count("crowds_suppressed") == 50
    assert len(released_windows) == run.count("crowds_released")
    for end, n_released in released_windows.items():
        assert end - WINDOW_MS in starts
        assert n_released <= 20  # never more than the crowd: an abort is not clamped to n
    assert run.count("reports_valid") == 1000
    assert run.count("reports_deleted") + run.count("reports_released") == 1000
    assert run.count("reports_released") == sum(released_windows.values())


def test_unpublished_deletions_are_none_on_every_batch(tmp_path: Path) -> None:
    # SPEC does not publish deletions: no batch may claim a deletion count (not even 0), whichever batch of its
    # sub-crowd it is (batch_size = 50 cuts each of the ~4 sub-crowds of ~90 reports into two batches).
    pop = Population(SPEC, seed=62)
    pop.crowd(400, WIN_A)
    run = shuffle_run(tmp_path, SPEC, pop.reports, seed=3, batch_size=50)
    assert len(run.values("released")) > SPEC.crowd.subkeys
    assert [b.deleted for b in run.values("released")] == [None] * len(run.values("released"))


@pytest.mark.parametrize("batch_size", [4096, 50])
def test_published_deletions_add_up_to_the_deleted_reports(tmp_path: Path, batch_size: int) -> None:
    spec = spec_from_dict({"analysis": {"name": "published"}, "domain": {"size": 8},
                           "mechanism": {"name": "grr", "epsilon": 1.0},
                           "crowd": {"epsilon": EPS_CR, "delta": DELTA_CR, "subkeys": 4, "publish_deletions": True}})
    pop = Population(spec, seed=61)
    inputs = pop.crowd(400, WIN_A)
    run = shuffle_run(tmp_path, spec, pop.reports, seed=3, batch_size=batch_size)
    batches = run.values("released")
    assert all(b.deleted is not None for b in batches)
    deleted = len(inputs) - sum(len(b.reports) for b in batches)
    assert sum(b.deleted for b in batches) == deleted == run.count("reports_deleted")
    assert_deletions_plausible(deleted)


# --- streaming semantics (TestStream): one pane per crowd, late reports never released -----------------------

def timestamped(reports: list[ReportElement]) -> list[window.TimestampedValue]:
    return [window.TimestampedValue(r, Timestamp(micros=r.event_time_ms * 1000)) for r in reports]


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> tuple[PipelineRun, list[ReportElement], ReportElement]:
    """400 on-time reports of window A in two bursts (the watermark advances in between), then the watermark
    passes the end of window A, then one late report for window A from a new client."""
    pop = Population(SPEC, seed=71)
    first, second = pop.crowd(200, WIN_A), pop.crowd(200, WIN_A)
    late = pop.add(pop.new_client(), WIN_A + 5, (3,), offset=999_999)
    stream = (TestStream()
              .add_elements(timestamped(first))
              .advance_watermark_to(Timestamp(micros=(WIN_A + WINDOW_MS // 2) * 1000))
              .add_elements(timestamped(second))
              .advance_watermark_to(Timestamp(micros=(WIN_B + 60_000) * 1000))
              .add_elements(timestamped([late]))
              .advance_watermark_to_infinity())

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        released, dead = p | stream | Shuffle(SPEC, seed=12)
        return {"released": released, "dead": dead}

    return run_pipeline(tmp_path_factory.mktemp("stream"), build, streaming=True), first + second, late


def test_a_crowd_is_released_once_not_per_burst(streamed: tuple[PipelineRun, list[ReportElement],
                                                                ReportElement]) -> None:
    # An early firing would release the first burst as a crowd of its own (and threshold it twice).
    run, on_time, _ = streamed
    assert run.count("crowds_released") == 1
    assert run.count("crowds_suppressed") == run.count("crowds_aborted") == 0
    rows = released_rows(run)
    assert_sub_multiset(rows, [r.payload for r in on_time])
    assert_deletions_plausible(len(on_time) - len(rows))
    assert {b.window_end_ms for b in run.values("released")} == {WIN_A + WINDOW_MS}


def test_a_late_report_is_never_released(streamed: tuple[PipelineRun, list[ReportElement], ReportElement]) -> None:
    run, on_time, _ = streamed
    assert run.count("reports_valid") == len(on_time)
    assert run.count("reports_released") + run.count("reports_deleted") == len(on_time)
    assert run.count("reports_released") == len(released_rows(run))


def test_a_late_report_is_dead_lettered_as_late(streamed: tuple[PipelineRun, list[ReportElement],
                                                                ReportElement]) -> None:
    # DESIGN.md §5: "Late reports are counted and dead-lettered as late, never released." (DeadLetter.avsc:
    # "Nothing is dropped silently.")
    run, _, late = streamed
    letters = [d for d in run.values("dead") if d["offset"] == late.source.offset]
    assert len(letters) == 1, f"the late report vanished: dead letters {run.values('dead')}"
    assert "late" in letters[0]["reason"] and letters[0]["stage"] == "shuffle"


# --- deduplication ----------------------------------------------------------------------------------------------

def test_one_report_per_client_and_window(tmp_path: Path) -> None:
    pop = Population(SPEC, seed=31)
    base = pop.crowd(200, WIN_A)
    pop.crowd(150, WIN_B)
    c0, c1, c2 = base[5], base[6], base[7]
    # c0 sends a second report at the window start (earlier than its first, but arriving later with a higher
    # offset): the earlier one is kept and the first one is the duplicate.
    assert c0.event_time_ms > WIN_A
    pop.add(c0.client_id, WIN_A, c0.payload, offset=100_000)
    expect_dead_c0 = c0
    # c1 sends a second report at the same event time with a lower offset: the tie goes to the lower offset.
    pop.add(c1.client_id, c1.event_time_ms, c1.payload, offset=1)
    expect_dead_c1 = c1
    # c2 also reports in window B: a different window, so both are kept.
    pop.add(c2.client_id, WIN_B + 123, c2.payload)
    run = shuffle_run(tmp_path, SPEC, pop.reports, seed=9)
    dead = run.values("dead")
    assert sorted(d["offset"] for d in dead) == sorted([expect_dead_c0.source.offset, expect_dead_c1.source.offset])
    for letter in dead:
        validate(letter, load_schema("DeadLetter").parsed, raise_errors=True)
        assert "duplicate" in letter["reason"]
        assert letter["stage"] == "shuffle" and letter["spec_id"] == SPEC.spec_id
        assert letter["original"] in {expect_dead_c0.original, expect_dead_c1.original}
    # Dead letters leave the event-time windows (they are merged with other stages' dead letters).
    assert all(o.window_start_us is None for o in run.outputs["dead"])
    assert run.count("dead_lettered") == 2
    assert run.count("reports_valid") == 200 + 150 + 1
    assert run.count("distinct_clients") == 200 + 150 + 1
    assert run.count("reports_valid") == run.count("reports_deleted") + run.count("reports_released")
    window_b_rows = sum(len(b.reports) for b in run.values("released") if b.window_end_ms == WIN_B + WINDOW_MS)
    assert_deletions_plausible(151 - window_b_rows)


def test_quota_of_two_keeps_the_two_earliest(tmp_path: Path) -> None:
    spec = make_spec(quota=2)
    pop = Population(spec, seed=41)
    base = pop.crowd(100, WIN_A)
    first = base[2]  # event time uniform inside the window
    late = pop.add(first.client_id, WIN_A + WINDOW_MS - 1, (3,))  # the latest possible time: over quota
    pop.add(first.client_id, WIN_A, (4,))  # the earliest possible time: kept although it arrived last
    run = shuffle_run(tmp_path, spec, pop.reports, seed=2)
    (letter,) = run.values("dead")
    assert letter["offset"] == late.source.offset and "duplicate" in letter["reason"]
    assert run.count("reports_valid") == 101
    assert run.count("dead_lettered") == 1


# --- Beam metrics ------------------------------------------------------------------------------------------------

def test_counters_account_for_every_report(tmp_path: Path) -> None:
    pop = Population(SPEC, seed=51)
    crowd_a = pop.crowd(500, WIN_A)
    pop.crowd(12, WIN_B)  # suppressed
    duplicates = 0
    for report in crowd_a[:40]:
        pop.add(report.client_id, report.event_time_ms + (1 if report.event_time_ms < WIN_B - 1 else 0),
                report.payload)
        duplicates += 1
    run = shuffle_run(tmp_path, SPEC, pop.reports, seed=6)
    assert run.count("reports_valid") == 512
    assert run.count("dead_lettered") == duplicates == len(run.values("dead"))
    assert run.count("reports_valid") + run.count("dead_lettered") == len(pop.reports)
    assert run.count("reports_valid") == run.count("reports_deleted") + run.count("reports_released")
    assert run.count("reports_released") == len(released_rows(run))
    assert run.count("crowds_released") == 1 and run.count("crowds_suppressed") == 1
    assert_deletions_plausible(500 - run.count("reports_released"))


# --- the pure helpers: integer Laplace noise and n_hat (MECHANISMS.md §7.2) ------------------------------------------

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
    # and L is an integer, D = ceil(T) - L exactly: E[D] = ceil(T) = 30 (MECHANISMS.md §7.2 says T = 29.02, which
    # ignores the rounding; the difference is below one report) and Var[D] = Var[L] = 2q/(1-q)^2 = 7.835
    # (§7.2's 8/eps_cr^2 = 8 is the continuous Laplace's; 2 % apart at eps_cr = 1).
    rng = np.random.default_rng(2024)
    n = 3000
    deleted = np.array([n - noisy_crowd_target(n, discrete_laplace(rng, EPS_CR), T) for _ in range(DRAWS)])
    _, var, mu4 = exact_moments(EPS_CR)
    se_mean = math.sqrt(var / DRAWS)  # 0.0198
    assert abs(deleted.mean() - math.ceil(T)) < 4 * se_mean
    assert abs(deleted.mean() - T) < 1.0
    assert abs(deleted.var(ddof=1) - var) < 4 * math.sqrt((mu4 - var**2) / DRAWS)
    assert abs(deleted.var(ddof=1) - 8 / EPS_CR**2) < 0.03 * 8 / EPS_CR**2 + 4 * math.sqrt((mu4 - var**2) / DRAWS)
    # An abort (n_hat > n) needs L >= T + 1, probability q^31/(1+q) = 1.2e-7: none in 20,000 draws.
    assert deleted.min() >= 0


@pytest.mark.parametrize(("n", "noise", "expected"), [
    (100, 0, 70),      # floor(100 - 29.017) = 70
    (100, 3, 73),
    (100, -3, 67),
    (29, 0, 0),        # floor(-0.017) = -1, clipped to 0
    (10, 0, 0),
    (10, 20, 0),       # floor(0.98) = 0: still withheld
    (10, 21, 1),
    (0, 0, 0),
    (100, 31, 101),    # n_hat > n: the caller must abort, the helper does not clamp
])
def test_noisy_crowd_target(n: int, noise: int, expected: int) -> None:
    assert noisy_crowd_target(n, noise, T) == expected
