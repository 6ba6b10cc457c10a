"""Analyze stage (transforms/analyze.py) and the file sinks (transforms/sinks.py).

ShuffledBatches are built with each mechanism's own ``encode`` from a known histogram (seeded numpy
Generator), stamped with their window's max timestamp and windowed as the shuffler emits them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import apache_beam as beam
import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp
from fastavro.validation import validate

from schemas import load_schema
from tests.beam_harness import PipelineRun, run_pipeline
from transforms.analyze import Analyze, FrequencyCombineFn, _key_by_crowd, central_epsilon, estimate_rows
from transforms.mechanisms.frequency import GRR
from transforms.privacy.composition import chain_composition
from transforms.privacy.shuffle_bound import epsilon_central
from transforms.records import ReportElement, ShuffledBatch, SourceRef, array_to_rows, dead_letter
from transforms.shuffle import Shuffle
from transforms.sinks import ESTIMATE_ARROW_SCHEMA, WriteAvroFile, WriteEstimatesParquet
from transforms.spec import AnalysisSpec, spec_from_dict

# --- specs, truth, batches ------------------------------------------------------------------------------------

WINDOW_MS = 3_600_000
WIN_A = 472_222 * WINDOW_MS
WIN_B = WIN_A + WINDOW_MS
N = 20_000
TRUE_COUNTS = np.array([6000, 4000, 3000, 2000, 2000, 1600, 1000, 400])  # sums to N; includes a rare item
MECHANISMS = ["grr", "oue", "olh"]
ESTIMATE_FIELDS = [f["name"] for f in load_schema("Estimate").parsed["fields"]]


def make_spec(mechanism: str, name: str = "analyze_test") -> AnalysisSpec:
    return spec_from_dict({"analysis": {"name": name},
                           "domain": {"categories": ["en", "de", "fr", "es", "it", "nl", "pl", "pt"]},
                           "mechanism": {"name": mechanism, "epsilon": 1.0},
                           "window": {"size_seconds": WINDOW_MS // 1000}})


def encoded_reports(spec: AnalysisSpec, counts: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.permutation(np.repeat(np.arange(spec.d), counts))
    return spec.randomizer.encode(values, rng)


def split(spec: AnalysisSpec, reports: np.ndarray, window_end_ms: int, cuts: list[int]) -> list[ShuffledBatch]:
    return [ShuffledBatch(spec.spec_id, None, window_end_ms, part) for part in np.split(reports, cuts)]


def windowed(p: beam.Pipeline, label: str, batches: list[Any]) -> beam.PCollection:
    """Batches as the shuffler emits them: timestamp = window end - 1 us, in fixed event-time windows."""
    return (p
            | f"Create{label}" >> beam.Create(batches)
            | f"Stamp{label}" >> beam.Map(lambda b: window.TimestampedValue(
                b, Timestamp(micros=b.window_end_ms * 1000 - 1)))
            | f"Window{label}" >> beam.WindowInto(window.FixedWindows(WINDOW_MS // 1000)))


class MechanismRun(NamedTuple):
    spec: AnalysisSpec
    reports: np.ndarray
    run: PipelineRun


@pytest.fixture(scope="module", params=MECHANISMS)
def analyzed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> MechanismRun:
    spec = make_spec(request.param)
    reports = encoded_reports(spec, TRUE_COUNTS, seed=1000 + MECHANISMS.index(request.param))
    end = WIN_A + WINDOW_MS

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        one = windowed(p, "One", split(spec, reports, end, []))
        # Uneven cuts, two single-report batches and one empty batch.
        many = windowed(p, "Many", split(spec, reports, end, [1, 2, 500, 7000, 7001, 7001, 15000]))
        return {"one": one | "AnalyzeOne" >> Analyze(spec), "many": many | "AnalyzeMany" >> Analyze(spec)}

    return MechanismRun(spec, reports, run_pipeline(tmp_path_factory.mktemp(request.param), build))


def by_item(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["item_index"])


# --- Analyze ------------------------------------------------------------------------------------------------

def test_one_valid_estimate_row_per_item(analyzed: MechanismRun) -> None:
    spec, mech = analyzed.spec, analyzed.spec.randomizer
    rows = by_item(analyzed.run.values("many"))
    assert [r["item"] for r in rows] == list(spec.categories)
    assert [r["item_index"] for r in rows] == list(range(spec.d))
    for row in rows:
        assert set(row) == set(ESTIMATE_FIELDS)
        validate(row, load_schema("Estimate").parsed, raise_errors=True)
        assert row["spec_id"] == spec.spec_id and row["analysis"] == spec.name and row["crowd_id"] is None
        assert row["n_reports"] == N and row["n_clients"] == N
        assert row["estimate"] == row["raw_estimate"]  # no post-processing configured
        assert row["n_deleted"] is None  # the analyzer never learns the crowd size
        assert row["eps_local"] == spec.epsilon
        assert row["delta"] == spec.delta
        assert row["mechanism"] == spec.mechanism
        assert json.loads(row["parameters"]) == mech.parameters()
        assert math.isfinite(row["estimate"]) and row["stderr"] > 0


def test_central_epsilon_is_the_tight_shuffle_bound(analyzed: MechanismRun) -> None:
    spec, mech = analyzed.spec, analyzed.spec.randomizer
    expected = epsilon_central(N, mech.mixture_alpha, spec.epsilon, spec.delta)
    for row in analyzed.run.values("many"):
        assert row["eps_central"] == pytest.approx(expected, rel=1e-12)
        assert row["eps_central"] < row["eps_local"]  # 20,000 reports amplify eps = 1 to about 0.02


def test_estimates_are_within_4_5_standard_errors_of_the_truth(analyzed: MechanismRun) -> None:
    # Standard errors from the closed-form variance at the *true* counts (MECHANISMS.md §2, §3.1, §4), not the
    # row's own plug-in value. |z| < 4.5 for each of 3 mechanisms x 8 items: a two-sided normal tail of 6.8e-6
    # each, so a correct analyzer fails with probability < 24 * 6.8e-6 = 1.6e-4 (Bonferroni); seeds are fixed.
    mech = analyzed.spec.randomizer
    truth = TRUE_COUNTS / N
    se_theory = np.sqrt(mech.variance(TRUE_COUNTS, N)) / N
    rows = by_item(analyzed.run.values("many"))
    z = (np.array([r["estimate"] for r in rows]) - truth) / se_theory
    assert np.abs(z).max() < 4.5, z
    # The reported (plug-in) stderr is the closed form at the estimated counts: within 5 % of the truth's
    # (counts are off by ~1 % of N and the variance is linear in them; 60 seeds gave at most 1.8 %).
    np.testing.assert_allclose([r["stderr"] for r in rows], se_theory, rtol=0.05)


def test_splitting_into_batches_changes_nothing(analyzed: MechanismRun) -> None:
    # Count arrays merge by addition, so any batching and any combine tree give bit-identical estimates.
    assert by_item(analyzed.run.values("one")) == by_item(analyzed.run.values("many"))


def test_rows_carry_the_window(analyzed: MechanismRun) -> None:
    for observed in analyzed.run.outputs["many"]:
        row = observed.value
        assert (row["window_start"], row["window_end"]) == (WIN_A, WIN_A + WINDOW_MS)
        assert (observed.window_start_us, observed.window_end_us) == (WIN_A * 1000, (WIN_A + WINDOW_MS) * 1000)


def test_each_window_is_estimated_on_its_own(tmp_path: Path) -> None:
    spec = make_spec("grr")
    counts_a = np.array([300, 300, 300, 300, 300, 300, 300, 900])
    counts_b = np.array([2000, 0, 0, 0, 0, 0, 0, 3000])
    a = split(spec, encoded_reports(spec, counts_a, 1), WIN_A + WINDOW_MS, [100, 1000])
    b = split(spec, encoded_reports(spec, counts_b, 2), WIN_B + WINDOW_MS, [2500])

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        return {"rows": windowed(p, "", [b[1], a[0], b[0], a[2], a[1]]) | Analyze(spec)}

    run = run_pipeline(tmp_path, build)
    rows = run.values("rows")
    assert len(rows) == 2 * spec.d
    for start, counts in ((WIN_A, counts_a), (WIN_B, counts_b)):
        mine = by_item([r for r in rows if r["window_start"] == start])
        assert len(mine) == spec.d
        assert all(r["window_end"] == start + WINDOW_MS and r["n_reports"] == counts.sum() for r in mine)
        expected = epsilon_central(int(counts.sum()), spec.randomizer.mixture_alpha, spec.epsilon, spec.delta)
        assert all(r["eps_central"] == pytest.approx(expected, rel=1e-12) for r in mine)
        # 4.5 SE per item, 2 windows x 8 items (Bonferroni: < 1.1e-4 family-wise).
        se = np.sqrt(spec.randomizer.variance(counts, counts.sum())) / counts.sum()
        z = (np.array([r["estimate"] for r in mine]) - counts / counts.sum()) / se
        assert np.abs(z).max() < 4.5, (start, z)
    assert run.counters["reports_analyzed"] == counts_a.sum() + counts_b.sum()
    assert run.counters["windows_estimated"] == 2


@pytest.mark.parametrize("publish", [False, True])
def test_shuffle_then_analyze_ledger(tmp_path: Path, publish: bool) -> None:
    # The two stages chained as in pipelines/end_to_end.py: n_reports is what the shuffler released, and
    # n_deleted is null unless the spec opts into publishing deletions, in which case it is their exact number.
    spec = spec_from_dict({"analysis": {"name": "chain"}, "domain": {"size": 8},
                           "mechanism": {"name": "grr", "epsilon": 1.0}, "window": {"size_seconds": WINDOW_MS // 1000},
                           "crowd": {"subkeys": 4, "publish_deletions": publish}})
    rng = np.random.default_rng(5)
    payloads = array_to_rows(spec.randomizer.encode(rng.integers(0, 8, 1200), rng))
    reports = [ReportElement(spec.spec_id, 0, f"client-{i}", WIN_A + int(rng.integers(WINDOW_MS)), row)
               for i, row in enumerate(payloads)]

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        released, _ = p | beam.Create(reports) | Shuffle(spec, seed=8, batch_size=100)
        return {"rows": released | Analyze(spec)}

    run = run_pipeline(tmp_path, build)
    rows = run.values("rows")
    assert len(rows) == spec.d
    released, deleted = run.counters["reports_released"], run.counters["reports_deleted"]
    assert released + deleted == 1200
    for row in rows:
        assert row["n_reports"] == released == run.counters["reports_analyzed"]
        assert row["n_deleted"] == (deleted if publish else None)
        assert (row["window_start"], row["window_end"]) == (WIN_A, WIN_A + WINDOW_MS)
        validate(row, load_schema("Estimate").parsed, raise_errors=True)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_combine_fn_merges_in_any_order(mechanism: str) -> None:
    # The CombineFn directly (no runner): any grouping of add_input / merge_accumulators, including empty
    # accumulators, decodes to bit-identical rows.
    spec = make_spec(mechanism)
    reports = encoded_reports(spec, TRUE_COUNTS // 10, seed=7)
    combine = FrequencyCombineFn(spec.randomizer)

    def accumulate(parts: list[np.ndarray]) -> Any:
        acc = combine.create_accumulator()
        for part in parts:
            acc = combine.add_input(acc, ShuffledBatch(spec.spec_id, None, WIN_A + WINDOW_MS, part))
        return acc

    def rows(acc: Any) -> list[dict[str, Any]]:
        return estimate_rows(spec, 0, combine.extract_output(acc), WIN_A, WIN_A + WINDOW_MS)

    whole = rows(accumulate([reports]))
    assert all(r["n_reports"] == len(reports) for r in whole)
    parts = np.split(reports, [10, 11, 900, 1500])
    accs = [accumulate([part]) for part in parts]
    merged = combine.merge_accumulators([accs[3], combine.merge_accumulators([accs[0], accs[4]]), accs[1], accs[2]])
    assert rows(merged) == whole
    assert rows(accumulate(parts)) == whole
    assert rows(combine.merge_accumulators([combine.create_accumulator(), accumulate([reports])])) == whole


# --- sinks ------------------------------------------------------------------------------------------------------

def sample_estimate_rows() -> list[dict[str, Any]]:
    """Estimate records of two specs and two windows (one publishing n_deleted), valid for the Avro schema."""
    rng = np.random.default_rng(77)
    rows: list[dict[str, Any]] = []
    for spec_id, mechanism, n_deleted in (("sink_grr@0123456789ab", "grr", None), ("sink_olh@ba9876543210", "olh", 31)):
        for start in (WIN_A, WIN_B):
            for i, item in enumerate(("en", "de", "fr")):
                rows.append({
                    "schema_version": 1, "spec_id": spec_id, "analysis": spec_id.split("@")[0],
                    "window_start": start, "window_end": start + WINDOW_MS, "crowd_id": None, "item": item,
                    "item_index": i, "estimate": float(rng.normal(0.3, 0.1)), "stderr": float(rng.uniform(0.001, 0.01)),
                    "raw_estimate": float(rng.normal(0.3, 0.1)), "n_reports": 20_000 + i, "n_clients": 20_000 + i,
                    "n_deleted": n_deleted, "eps_local": 1.0,
                    "eps_central": float(rng.uniform(0.01, 0.1)), "delta": 1e-6, "mechanism": mechanism,
                    "parameters": json.dumps({"d": 3, "epsilon": 1.0}),
                })
    return rows


def only_file(directory: Path) -> Path:
    entries = sorted(directory.iterdir())
    assert len(entries) == 1, f"expected exactly one file in {directory}, found {[e.name for e in entries]}"
    return entries[0]


def sort_key(row: dict[str, Any]) -> tuple:
    return row["spec_id"], row["window_start"], row["item_index"]


def test_arrow_schema_mirrors_the_avro_estimate_schema() -> None:
    avro_to_arrow = {"int": pa.int32(), "long": pa.int64(), "double": pa.float64(), "string": pa.string()}
    fields = load_schema("Estimate").parsed["fields"]
    assert ESTIMATE_ARROW_SCHEMA.names == [f["name"] for f in fields]
    for field in fields:
        avro_type = field["type"]
        nullable = isinstance(avro_type, list)
        base = next(t for t in avro_type if t != "null") if nullable else avro_type
        assert ESTIMATE_ARROW_SCHEMA.field(field["name"]).type == avro_to_arrow[base], field["name"]


def test_write_estimates_parquet_writes_one_file_at_the_path(tmp_path: Path) -> None:
    rows = sample_estimate_rows()
    for row in rows:
        validate(row, load_schema("Estimate").parsed, raise_errors=True)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    path = out_dir / "estimates.parquet"

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        # Rows arrive in their event-time windows, as from Analyze: the sink must still write one file.
        stamped = (p | beam.Create(rows)
                   | beam.Map(lambda r: window.TimestampedValue(r, Timestamp(micros=r["window_end"] * 1000 - 1)))
                   | beam.WindowInto(window.FixedWindows(WINDOW_MS // 1000)))
        stamped | WriteEstimatesParquet(str(path))
        return {}

    run_pipeline(tmp_path, build)
    assert only_file(out_dir) == path
    table = pq.read_table(path)
    assert table.schema.equals(ESTIMATE_ARROW_SCHEMA, check_metadata=False), table.schema
    assert sorted(table.to_pylist(), key=sort_key) == sorted(rows, key=sort_key)


def test_write_avro_file_writes_dead_letters_fastavro_can_read(tmp_path: Path) -> None:
    letters = [
        dead_letter("decode", "not an Avro single-object message", original=b"\x00junk",
                    source=SourceRef("telemetry", 2, 41)),
        dead_letter("shuffle", "duplicate: client c already sent 1 report(s)", original=b"\xc3\x01...",
                    source=SourceRef("reports", 0, 7), spec_id="lang@0123456789ab"),
        dead_letter("decode", "tombstone"),  # every optional field null
    ]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    path = out_dir / "dead_letters.avro"

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        p | beam.Create(letters) | WriteAvroFile(str(path), "DeadLetter")
        return {}

    run_pipeline(tmp_path, build)
    assert only_file(out_dir) == path
    with path.open("rb") as handle:
        reader = fastavro.reader(handle)
        assert reader.writer_schema["name"] == "esa.telemetry.DeadLetter"
        back = list(reader)
    assert sorted(back, key=lambda d: d["reason"]) == sorted(letters, key=lambda d: d["reason"])


# --- ledger with several reports per client ---------------------------------------------------------------

def test_several_reports_per_client_compose_in_the_ledger() -> None:
    """k reports per client: k times the single-report bound at delta / sum_{i<k} e^{i eps}, total delta kept."""
    mech, n, delta = GRR(16, 1.5), 20_000, 1e-6
    one = central_epsilon(mech, n, delta, 1)
    assert one == pytest.approx(epsilon_central(n, mech.mixture_alpha, 1.5, delta))
    for k in (2, 3):
        spread = sum(math.exp(i * 1.5) for i in range(k))
        per_report = epsilon_central(n, mech.mixture_alpha, 1.5, delta / spread)
        eps_k, delta_k = chain_composition(per_report, delta / spread, k)
        assert central_epsilon(mech, n, delta, k) == pytest.approx(eps_k)
        assert delta_k <= delta
        assert one < central_epsilon(mech, n, delta, k) <= k * 1.5
    assert central_epsilon(mech, 1, delta, 3) == 3 * 1.5


def test_analyze_refuses_a_batch_of_another_spec() -> None:
    batch = ShuffledBatch("other@000000000000", None, 0, np.zeros(0, dtype=[("value", "<i8")]))
    with pytest.raises(ValueError, match="reached the analyzer"):
        _key_by_crowd(batch, "mine@111111111111")
