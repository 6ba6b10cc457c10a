"""Several messages per client through the real stages: attribute fragments, presence markers, crowd ids.

Events are real TelemetryEvent bytes of enrolled simulated devices. Encode + SealSetsFn run on the
FnApiRunner and give signed MessageSets; IngressFn + Shuffle run on them (drain); the released parts are
numbered and signed like the driver does, then DecodeReleaseFn + OpenBatchFn + AssembleReleaseFn open them and
``estimate_rows`` estimates. Checks:

* each crowd (public partition) is thresholded, released and estimated on its own and its id is published;
* the analyzer counts released clients by their presence markers (a k-RAPPOR client may send no set bit);
* every set and message is accounted for (valid = deleted + released; released messages = analyzed
  messages) and whole message sets are deleted (markers = released sets);
* a release part carries nothing that links its messages: routing fields are constant over a crowd and the
  messages are distinct sealed blobs.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pytest

from pipelines.enrolment import enrol_simulated
from schemas import SCHEMA_VERSION, encode_record
from tests.beam_harness import PipelineRun, run_pipeline
from tests.transforms.release_inputs import NOW_MS, Devices, open_and_assemble, shuffle_run, sign_release
from tests.transforms.release_inputs import decode_set as decode_message_set
from transforms.analyzer.estimates import estimate_rows
from transforms.analyzer.releases import DecodeReleaseFn, OpenedRelease
from transforms.encoder.encode import EncodeEvents
from transforms.encoder.seal import SealSetsFn
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.state.prior_runs import PriorRuns
from transforms.trust.release import release_id_of
from transforms.wire.rows import PRESENCE

WINDOW_S = 3600
T0 = NOW_MS - 5 * WINDOW_S * 1000  # a recent window: ingress refuses event times older than max_age
D = 12
# A partition charges the crowd count, sized for a year of hourly windows: epsilon_year = 30 (the most a spec
# allows) keeps the threshold at ~195 deletions (sigma ~31), so both crowds release.
CROWDS = {"v1": 600, "v2": 450}


def fragment_spec() -> AnalysisSpec:
    return spec_from_dict({
        "analysis": {"name": "frag", "metric": "frag"},
        "domain": {"size": D},
        "mechanism": {"name": "rappor", "epsilon": 3.0},
        "window": {"size_seconds": WINDOW_S, "allowed_lateness_seconds": 0},
        "crowd": {"epsilon": 1.0, "delta": 1e-6, "subkeys": 4, "partition": "app_version", "epsilon_year": 30.0},
    })


def population(seed: int) -> tuple[list[KafkaRecord], dict[str, np.ndarray], list[str]]:
    rng = np.random.default_rng(seed)
    records, truth, clients = [], {}, []
    law = np.arange(D, 0, -1, dtype=float) / np.arange(D, 0, -1).sum()
    for crowd, n in CROWDS.items():
        values = rng.choice(D, size=n, p=law)
        truth[crowd] = np.bincount(values, minlength=D) / n
        for i, v in enumerate(values.tolist()):
            event = {"schema_version": SCHEMA_VERSION, "client_id": f"{crowd}-client-{i}",
                     "event_time": T0 + int(rng.integers(WINDOW_S * 1000)), "metric": "frag", "value": int(v),
                     "crowd_id": crowd}
            clients.append(event["client_id"])
            records.append(KafkaRecord("telemetry", 0, len(records), event["event_time"], None,
                                       encode_record("TelemetryEvent", event)))
    return records, truth, clients


class FragmentRun(NamedTuple):
    spec: AnalysisSpec
    sets: list[bytes]
    keys: list[bytes]
    shuffled: PipelineRun
    opened: dict[str, OpenedRelease]
    rows: list[dict[str, Any]]
    truth: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def fragment_run(tmp_path_factory: pytest.TempPathFactory) -> FragmentRun:
    tmp = tmp_path_factory.mktemp("frag")
    spec = fragment_spec()
    events, truth, clients = population(3)
    enrol_simulated(tmp / "keys", clients)
    devices = Devices(tmp / "keys", clients)

    def encode(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        reports, dead = p | beam.Create(events) | EncodeEvents([spec], job_key_from_seed(5))
        sealed = reports | beam.ParDo(SealSetsFn([spec], str(devices.keys_dir)))
        return {"sets": sealed, "dead": dead}

    encoded = run_pipeline(tmp, encode)
    assert encoded.values("dead") == []
    keys = [key for key, _ in encoded.values("sets")]
    sets = [value for _, value in encoded.values("sets")]
    shuffled = shuffle_run(tmp, [spec], devices, [devices.record(v) for v in sets])
    decode = DecodeReleaseFn([spec], str(devices.keys_dir), PriorRuns())
    decode.setup()
    opened, rows = {}, []
    for rid, batches in sign_release(devices.keys_dir, shuffled.values("released"), per_batch=200).items():
        keyed = [kv for i, b in enumerate(batches) for kv in decode.process(KafkaRecord("shuffled", 0, i, 0, None, b))]
        (opened[rid],), tagged = open_and_assemble([spec], devices.keys_dir, keyed)
        assert tagged == {}
        end = opened[rid].window_end_ms
        rows += estimate_rows(spec, opened[rid].crowd_id, opened[rid].accumulator, end - WINDOW_S * 1000, end)
    return FragmentRun(spec, sets, keys, shuffled, opened, rows, truth)


def test_each_crowd_is_released_and_estimated_on_its_own(fragment_run: FragmentRun) -> None:
    spec, rows = fragment_run.spec, fragment_run.rows
    end = (T0 // (WINDOW_S * 1000) + 1) * WINDOW_S * 1000
    assert set(fragment_run.opened) == {release_id_of(spec.spec_id, c, end) for c in CROWDS}
    assert {p.crowd_id for p in fragment_run.shuffled.values("released")} == set(CROWDS)
    assert {r["crowd_id"] for r in rows} == set(CROWDS)
    worst = 0.0
    for crowd, n in CROWDS.items():
        mine = sorted((r for r in rows if r["crowd_id"] == crowd), key=lambda r: r["item_index"])
        assert len(mine) == D
        n_clients = mine[0]["n_clients"]
        sigma, threshold = fragment_run.spec.crowd.count_design(WINDOW_S)
        assert abs(n - n_clients - threshold) < 5 * sigma  # the threshold deletes about T clients (T +- sigma)
        assert mine[0]["n_reports"] > n_clients  # markers + set bits
        est = np.array([r["estimate"] for r in mine])
        se = np.array([r["stderr"] for r in mine])
        e = math.exp(spec.epsilon)
        np.testing.assert_allclose(se, math.sqrt(e / (n_clients * (e - 1) ** 2)), rtol=1e-9)
        worst = max(worst, float(np.max(np.abs(est - fragment_run.truth[crowd]) / se)))
    # Bonferroni over 24 items at 4.5 sd (1.6e-4 family-wise). The ~30 deleted clients are a uniform sample
    # of the crowd, so removing them moves the true frequencies by far less than one stderr.
    assert worst < 4.5


def test_every_set_and_message_is_accounted_for(fragment_run: FragmentRun) -> None:
    run = fragment_run.shuffled
    assert len(fragment_run.sets) == sum(CROWDS.values())
    assert run.count("sets_authenticated") == run.count("sets_valid") == len(fragment_run.sets)
    assert run.count("sets_valid") == run.count("sets_deleted") + run.count("sets_released")
    opened = fragment_run.opened.values()
    assert run.count("messages_released") == sum(o.accumulator.messages for o in opened)
    markers = sum(c == PRESENCE for p in run.values("released") for c, _ in p.messages)
    assert markers == run.count("sets_released") == sum(o.n_sets for o in opened)
    clients = sum(r["n_clients"] for r in fragment_run.rows if r["item_index"] == 0)
    assert clients == markers
    # Each encoded set holds exactly one marker and its set bits on channels 0..D-1.
    for value in fragment_run.sets[:50]:
        channels = [m.channel for m in decode_message_set(value).messages]
        assert channels.count(PRESENCE) == 1 and all(-1 <= c < D for c in channels)


def test_release_parts_carry_nothing_that_links_messages(fragment_run: FragmentRun) -> None:
    parts = fragment_run.shuffled.values("released")
    for crowd in CROWDS:
        mine = [p for p in parts if p.crowd_id == crowd]
        assert len({(p.spec_id, p.crowd_id, p.window_end_ms) for p in mine}) == 1
        blobs = [s for p in mine for _, s in p.messages]
        assert len(set(blobs)) == len(blobs)  # every message sealed on its own: no shared ciphertext
    sets = [decode_message_set(v) for v in fragment_run.sets]
    data = b"".join(s for p in parts for _, s in p.messages)
    for ms in sets[:100]:
        assert ms.nonce not in data and ms.signature not in data and bytes.fromhex(ms.device_id) not in data


def test_encoder_output_is_keyed_by_the_signing_device(fragment_run: FragmentRun) -> None:
    # SealSetsFn's Kafka key is the id of the device whose key signed the set: one device, one partition.
    ids = [decode_message_set(v).device_id.encode() for v in fragment_run.sets]
    assert fragment_run.keys == ids and len(set(ids)) == len(ids)
