"""Estimates of opened releases (analyzer/estimates.py ``estimate_rows``, ``CrowdAccumulator``) and the sinks.

Reports are built with each mechanism's own ``encode`` from a known histogram (seeded numpy Generator)
and folded into a ``CrowdAccumulator`` as ``transforms.analyzer.releases.AssembleReleaseFn`` folds an
opened release; the chain test runs the real shuffler and analyzer ingress on sealed sets.
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
from schemas.arrow import ESTIMATE_ARROW_SCHEMA
from tests.beam_harness import run_pipeline
from tests.transforms.release_inputs import WIN_A as RECENT_WINDOW
from tests.transforms.release_inputs import Devices, open_and_assemble, shuffle_run, sign_release
from tests.transforms.release_inputs import make_spec as make_shuffle_spec
from transforms.analyzer.estimates import CrowdAccumulator, central_epsilon, estimate_rows
from transforms.analyzer.releases import DecodeReleaseFn
from transforms.io.dead_letters import dead_letter
from transforms.io.kafka.bounded import KafkaRecord
from transforms.io.sinks import WriteAvroFile, WriteEstimatesParquet
from transforms.mechanisms.frequency.oracles import GRR
from transforms.privacy.blanket_shuffle import best_epsilon, epsilon_blanket_shuffle
from transforms.privacy.composition import chain_composition
from transforms.privacy.shuffle_bound import epsilon_central
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.state.prior_runs import PriorRuns
from transforms.wire.elements import SourceRef
from transforms.wire.rows import count_clients

# --- specs, truth, accumulators ---------------------------------------------------------------------------------

WINDOW_MS = 3_600_000
WIN_A = 472_222 * WINDOW_MS
WIN_B = WIN_A + WINDOW_MS
N = 20_000
TRUE_COUNTS = np.array([6000, 4000, 3000, 2000, 2000, 1600, 1000, 400])  # sums to N; includes a rare item
MECHANISMS = ["grr", "oue", "olh"]
ESTIMATE_FIELDS = [f["name"] for f in load_schema("Estimate").parsed["fields"]]
# Filled by the analyzer's driver once the release is sealed in its ledger (pipelines/analyze.py).
DRIVER_FIELDS = {"release_id", "eps_central_cumulative", "windows_composed", "delta_cumulative", "notion",
                 "eps_count_cumulative"}


def make_spec(mechanism: str, name: str = "analyze_test") -> AnalysisSpec:
    return spec_from_dict({"analysis": {"name": name},
                           "domain": {"categories": ["en", "de", "fr", "es", "it", "nl", "pl", "pt"]},
                           "mechanism": {"name": mechanism, "epsilon": 1.0},
                           "window": {"size_seconds": WINDOW_MS // 1000}})


def encoded_reports(spec: AnalysisSpec, counts: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.permutation(np.repeat(np.arange(spec.d), counts))
    return spec.randomizer.encode(values, rng)


def accumulate(spec: AnalysisSpec, parts: list[np.ndarray], deleted: int | None = None) -> CrowdAccumulator:
    """Fold released parts as AssembleReleaseFn folds each batch of an opened release."""
    acc = CrowdAccumulator(spec.randomizer.new_accumulator(), deleted=deleted)
    for part in parts:
        messages, clients = count_clients(spec.randomizer, part)
        acc.counts.add(messages, clients)
        acc.messages += len(part)
    return acc


class MechanismRun(NamedTuple):
    spec: AnalysisSpec
    reports: np.ndarray
    rows: list[dict[str, Any]]  # from uneven parts


@pytest.fixture(scope="module", params=MECHANISMS)
def analyzed(request: pytest.FixtureRequest) -> MechanismRun:
    spec = make_spec(request.param)
    reports = encoded_reports(spec, TRUE_COUNTS, seed=1000 + MECHANISMS.index(request.param))
    # Uneven cuts, two single-report parts and one empty part.
    parts = np.split(reports, [1, 2, 500, 7000, 7001, 7001, 15000])
    return MechanismRun(spec, reports, by_item(estimate_rows(spec, None, accumulate(spec, parts), WIN_A,
                                                             WIN_A + WINDOW_MS)))


def by_item(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["item_index"])


# --- estimate rows ------------------------------------------------------------------------------------------------

def test_one_valid_estimate_row_per_item(analyzed: MechanismRun) -> None:
    spec, mech = analyzed.spec, analyzed.spec.randomizer
    rows = analyzed.rows
    assert [r["item"] for r in rows] == list(spec.categories)
    assert [r["item_index"] for r in rows] == list(range(spec.d))
    for row in rows:
        assert set(row) == set(ESTIMATE_FIELDS) - DRIVER_FIELDS
        validate(row, load_schema("Estimate").parsed, raise_errors=True)
        assert row["spec_id"] == spec.spec_id and row["analysis"] == spec.name and row["crowd_id"] is None
        assert row["n_reports"] == N and row["n_clients"] == N
        assert row["estimate"] == row["raw_estimate"]  # no post-processing configured
        assert row["n_deleted"] is None  # the analyzer never learns the crowd size unless published
        assert row["eps_local"] == spec.epsilon
        assert row["delta"] == spec.delta
        assert row["mechanism"] == spec.mechanism
        params = json.loads(row["parameters"])
        assert {k: v for k, v in params.items() if not k.startswith("eps_central_")} == mech.parameters()
        assert math.isfinite(row["estimate"]) and row["stderr"] > 0
        assert (row["window_start"], row["window_end"]) == (WIN_A, WIN_A + WINDOW_MS)


def test_central_epsilon_is_the_tight_shuffle_bound(analyzed: MechanismRun) -> None:
    spec, mech = analyzed.spec, analyzed.spec.randomizer
    generic = epsilon_central(N, mech.mixture_alpha, spec.epsilon, spec.delta)
    expected, bound = best_epsilon(N, mech.mixture_alpha, spec.epsilon, spec.delta, mech.blanket_decomposition())
    assert expected <= generic and expected <= epsilon_blanket_shuffle(N, mech.blanket_decomposition(),
                                                                       spec.epsilon, spec.delta)
    for row in analyzed.rows:
        assert row["eps_central"] == pytest.approx(expected, rel=1e-12)
        assert json.loads(row["parameters"])["eps_central_bound"] == bound
        assert row["eps_central"] < row["eps_local"]  # 20,000 reports amplify eps = 1 to about 0.02


def test_estimates_are_within_4_5_standard_errors_of_the_truth(analyzed: MechanismRun) -> None:
    # Standard errors from the closed-form variance at the *true* counts, not the row's own plug-in value.
    # |z| < 4.5 for each of 3 mechanisms x 8 items: a two-sided normal tail of 6.8e-6 each, so a correct
    # analyzer fails with probability < 24 * 6.8e-6 = 1.6e-4 (Bonferroni); seeds are fixed.
    mech = analyzed.spec.randomizer
    truth = TRUE_COUNTS / N
    se_theory = np.sqrt(mech.variance(TRUE_COUNTS, N)) / N
    z = (np.array([r["estimate"] for r in analyzed.rows]) - truth) / se_theory
    assert np.abs(z).max() < 4.5, z
    # The reported (plug-in) stderr is the closed form at the estimated counts: within 5 % of the truth's
    # (counts are off by ~1 % of N and the variance is linear in them).
    np.testing.assert_allclose([r["stderr"] for r in analyzed.rows], se_theory, rtol=0.05)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_accumulators_merge_in_any_order(mechanism: str) -> None:
    # A release's batches may be folded in any grouping: count arrays add, so the rows are bit-identical.
    spec = make_spec(mechanism)
    reports = encoded_reports(spec, TRUE_COUNTS // 10, seed=7)

    def rows(acc: CrowdAccumulator) -> list[dict[str, Any]]:
        return estimate_rows(spec, None, acc, WIN_A, WIN_A + WINDOW_MS)

    whole = rows(accumulate(spec, [reports]))
    assert all(r["n_reports"] == len(reports) for r in whole)
    parts = np.split(reports, [10, 11, 900, 1500])
    accs = [accumulate(spec, [part]) for part in parts]
    merged = accumulate(spec, [])
    for i in (3, 0, 4, 1, 2):
        merged.counts.merge(accs[i].counts)
        merged.messages += accs[i].messages
    assert rows(merged) == whole
    assert rows(accumulate(spec, parts)) == whole


# --- the two stages chained: shuffle, sign, decode, assemble, estimate ----------------------------------------------

@pytest.mark.parametrize("publish", [False, True])
def test_shuffle_then_analyze_counts_and_published_deletions(tmp_path: Path, publish: bool) -> None:
    # n_reports is what the shuffler released, and n_deleted is null unless the spec opts into publishing
    # deletions, in which case it is their exact number.
    spec = make_shuffle_spec(publish=publish, name=f"chain{int(publish)}")
    devices = Devices.enrol(tmp_path / "keys", 70)
    run = shuffle_run(tmp_path, [spec], devices, devices.crowd(spec, devices.clients, RECENT_WINDOW))
    assert run.values("dead") == []
    released, deleted = run.count("sets_released"), run.count("sets_deleted")
    assert released + deleted == 70 and released >= spec.crowd.min_clients
    (batches,) = sign_release(devices.keys_dir, run.values("released"), per_batch=16).values()
    decode = DecodeReleaseFn([spec], str(devices.keys_dir), PriorRuns())
    decode.setup()
    keyed = [kv for i, b in enumerate(batches) for kv in decode.process(KafkaRecord("shuffled", 0, i, 0, None, b))]
    (opened,), tagged = open_and_assemble([spec], devices.keys_dir, keyed)
    assert tagged == {}
    rows = estimate_rows(spec, None, opened.accumulator, RECENT_WINDOW, RECENT_WINDOW + WINDOW_MS)
    assert len(rows) == spec.d and opened.n_sets == released
    for row in rows:
        assert row["n_reports"] == row["n_clients"] == released
        assert row["n_deleted"] == (deleted if publish else None)
        validate(row, load_schema("Estimate").parsed, raise_errors=True)


# --- ledger with several reports per client ---------------------------------------------------------------

def test_several_reports_per_client_compose_in_the_ledger() -> None:
    """k reports per client: k times the single-report bound at delta / sum_{i<k} e^{i eps}, total delta kept."""
    mech, n, delta = GRR(16, 1.5), 20_000, 1e-6
    dec = mech.blanket_decomposition()
    one = central_epsilon(mech, n, delta, 1)
    assert one == pytest.approx(min(epsilon_central(n, mech.mixture_alpha, 1.5, delta),
                                    epsilon_blanket_shuffle(n, dec, 1.5, delta)))
    for k in (2, 3):
        spread = sum(math.exp(i * 1.5) for i in range(k))
        per_report = min(epsilon_central(n, mech.mixture_alpha, 1.5, delta / spread),
                         epsilon_blanket_shuffle(n, dec, 1.5, delta / spread))
        eps_k, delta_k = chain_composition(per_report, delta / spread, k)
        assert central_epsilon(mech, n, delta, k) == pytest.approx(eps_k)
        assert delta_k <= delta
        assert one < central_epsilon(mech, n, delta, k) <= k * 1.5
    assert central_epsilon(mech, 1, delta, 3) == 3 * 1.5


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
                    "eps_central_cumulative": float(rng.uniform(0.1, 0.2)), "windows_composed": 2,
                    "delta_cumulative": 3e-6,
                    "release_id": f"{start:032x}", "notion": "replacement", "eps_count_cumulative": None,
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
        # Rows arrive in event-time windows: the sink must still write one file.
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


def test_rows_state_the_honest_crowd_assumption(analyzed: MechanismRun) -> None:
    """eps_central rests on the other reports being honest: every row says so, and says what it becomes when
    a tenth of the crowd colludes (the tight bound for the honest remainder only)."""
    from transforms.analyzer.estimates import central_epsilon

    spec, mech = analyzed.spec, analyzed.spec.randomizer
    row = analyzed.rows[0]
    params = json.loads(row["parameters"])
    assert "honest crowd" in params["eps_central_assumes"]
    honest = row["n_clients"] - math.ceil(0.1 * row["n_clients"])
    assert params["eps_central_if_10pct_collude"] == central_epsilon(mech, honest, spec.delta)
    assert row["eps_central"] < params["eps_central_if_10pct_collude"] <= row["eps_local"]
