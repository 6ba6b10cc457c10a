"""Several messages per client through the real Beam stages: attribute fragments, presence markers, crowd ids.

Events are real TelemetryEvent bytes; Encode -> Shuffle -> Analyze runs on the FnApiRunner. Checks:

* each crowd (public partition) is thresholded and estimated on its own and its id is published;
* the analyzer counts released clients by their presence markers (a k-RAPPOR client may send no set bit);
* every message is accounted for (valid = deleted + released; released = analyzed) and whole message sets
  are deleted (deleted markers = deleted clients);
* the shuffled output of fragments carries no client id and no shared key: every field other than the
  channel (which *is* the message) is constant over a crowd, and the release order does not keep a
  client's messages together.
"""

from __future__ import annotations

import math
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

from schemas import SCHEMA_VERSION, decode_record, encode_record
from tests.beam_harness import PipelineRun, run_pipeline
from transforms.analyze import Analyze
from transforms.encode import EncodeEvents
from transforms.kafkaio import KafkaRecord
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.records import PRESENCE, ShuffledBatch, shuffled_records
from transforms.shuffle import ReleaseFn, Shuffle
from transforms.spec import AnalysisSpec, spec_from_dict

WINDOW_S = 3600
T0 = 500_000 * WINDOW_S * 1000
D = 12
CROWDS = {"v1": 2500, "v2": 1500}


def fragment_spec(**mechanism: object) -> AnalysisSpec:
    return spec_from_dict({
        "analysis": {"name": "frag", "metric": "frag"},
        "domain": {"size": D},
        "mechanism": {"name": "rappor", "epsilon": 3.0, **mechanism},
        "window": {"size_seconds": WINDOW_S},
        "crowd": {"epsilon": 1.0, "delta": 1e-6, "subkeys": 4, "partition": "app_version"},
    })


def population(seed: int) -> tuple[list[KafkaRecord], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    records, truth, offset = [], {}, 0
    law = np.arange(D, 0, -1, dtype=float) / np.arange(D, 0, -1).sum()
    for crowd, n in CROWDS.items():
        values = rng.choice(D, size=n, p=law)
        truth[crowd] = np.bincount(values, minlength=D) / n
        for i, v in enumerate(values.tolist()):
            event = {"schema_version": SCHEMA_VERSION, "client_id": f"{crowd}-client-{i}",
                     "event_time": T0 + int(rng.integers(WINDOW_S * 1000)), "metric": "frag", "value": int(v),
                     "crowd_id": crowd}
            records.append(KafkaRecord("telemetry", 0, offset, event["event_time"], None,
                                       encode_record("TelemetryEvent", event)))
            offset += 1
    return records, truth


@pytest.fixture(scope="module")
def fragment_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[AnalysisSpec, PipelineRun, dict]:
    spec = fragment_spec()
    records, truth = population(3)

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        reports, dead_enc = p | beam.Create(records) | EncodeEvents([spec], job_key_from_seed(5))
        released, dead_shuf = reports | Shuffle(spec, seed=9)
        estimates = released | Analyze(spec)
        return {"released": released, "estimates": estimates, "dead": (dead_enc, dead_shuf) | beam.Flatten()}

    return spec, run_pipeline(tmp_path_factory.mktemp("frag"), build), truth


def test_each_crowd_is_estimated_separately_and_named(fragment_run: tuple) -> None:
    spec, run, truth = fragment_run
    rows = run.values("estimates")
    assert {r["crowd_id"] for r in rows} == set(CROWDS)
    worst = 0.0
    for crowd, n in CROWDS.items():
        mine = sorted((r for r in rows if r["crowd_id"] == crowd), key=lambda r: r["item_index"])
        assert len(mine) == D
        n_clients = mine[0]["n_clients"]
        assert n - 80 < n_clients < n  # the threshold deletes about T = 29 clients
        assert mine[0]["n_reports"] > n_clients  # markers + set bits
        est = np.array([r["estimate"] for r in mine])
        se = np.array([r["stderr"] for r in mine])
        e = math.exp(spec.epsilon)
        np.testing.assert_allclose(se, math.sqrt(e / (n_clients * (e - 1) ** 2)), rtol=1e-9)
        worst = max(worst, float(np.max(np.abs(est - truth[crowd]) / se)))
    # Bonferroni over 24 items at 4.5 sd; the deleted clients shift truth by < 80/1500 of a frequency
    # at most, i.e. by well under one stderr here.
    assert worst < 4.5


def test_every_message_is_accounted_for(fragment_run: tuple) -> None:
    _, run, _ = fragment_run
    assert run.count("events_encoded") == sum(CROWDS.values())
    assert run.count("reports_valid") == run.count("reports_encoded")
    assert run.count("reports_valid") == run.count("reports_deleted") + run.count("reports_released")
    assert run.count("reports_released") == run.count("reports_analyzed")
    released = run.values("released")
    markers = sum(int((b.reports["channel"] == PRESENCE).sum()) for b in released)
    clients = sum(r["n_clients"] for r in run.values("estimates") if r["item_index"] == 0)
    assert markers == clients


def test_shuffled_fragments_carry_nothing_that_links_them(fragment_run: tuple) -> None:
    spec, run, _ = fragment_run
    records = [r for b in run.values("released") for r in shuffled_records(spec.randomizer, b)]
    assert records
    for crowd in CROWDS:
        mine = [r for r in records if r["crowd_id"] == crowd]
        for field in ("schema_version", "spec_id", "crowd_id", "window_end", "payload"):
            assert len({repr(r[field]) for r in mine}) == 1, field  # constant: cannot tell two messages apart
        assert all(r["payload"] == ("esa.telemetry.MarkPayload", {}) for r in mine)
    blob = b"".join(encode_record("ShuffledReport", r) for r in records)
    assert b"client" not in blob
    assert set(decode_record("ShuffledReport", encode_record("ShuffledReport", records[0]))) == {
        "schema_version", "spec_id", "crowd_id", "channel", "window_end", "payload"}


def test_release_order_does_not_keep_a_clients_messages_together(tmp_path: Path) -> None:
    # Distinct rows per message so we can see where each client's messages end up after ReleaseFn.
    spec = fragment_spec()
    # Message sets of wire rows (channel,): a presence marker, then channels j and j+1.
    sets = [tuple((c,) for c in (PRESENCE, j, (j + 1) % D)) for j in range(D)] * 40

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        joined = p | beam.Create([((None, 0), {"reports": [sets], "decision": [0]})])
        return {"out": joined | beam.ParDo(ReleaseFn(spec, 10_000, job_key_from_seed(1)))}

    run = run_pipeline(tmp_path, build)
    (batch,) = run.values("out")
    assert isinstance(batch, ShuffledBatch)
    channels = batch.reports["channel"]
    assert len(channels) == 3 * len(sets)
    # In the input each set is (marker, j, j+1): a marker is followed by its own set's channel j every time.
    # After the release permutation, a marker is followed by a given channel only by chance (~1/D).
    after_marker = channels[1:][channels[:-1] == PRESENCE]
    share = np.mean(np.isin(after_marker, np.arange(D)))  # anything but another marker
    assert 0.5 < share < 0.8  # 2/3 of messages are fragments; the input order would give exactly 1.0
    markers_in_a_row = np.mean(channels[1:][channels[:-1] == PRESENCE] == PRESENCE)
    assert 0.2 < markers_in_a_row < 0.5  # ~1/3 by chance; the input order would give 0
