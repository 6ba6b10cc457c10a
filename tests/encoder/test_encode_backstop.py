"""The edge encoder's permanent backstop (issue 23, item 6) and its keys (issue 25: labelled HKDF sub-keys).

On the pipeline path the backstop of ``rappor_fragments`` is a keyed PRF of (device, metric, backstop
parameters, value): one backstop per device and value over any number of windows, retries and reruns, where
a fresh draw per event gave 16 distinct backstops in 40 windows of one client. With eps_f = 15 a fragment
copies its backstop bit except with probability 3e-7, so every report shows the backstop it was drawn from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
from collections import defaultdict
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

from schemas import SCHEMA_VERSION, encode_record
from tests.beam_harness import run_pipeline
from tests.mechanisms.ldp_helpers import assert_counts_follow_law
from transforms.device.backstop import backstop_identity, prf_backstops
from transforms.encoder.encode import EncodeEvents
from transforms.encoder.keys import LABELS, SALT, EncoderKeys
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.frequency.unary_sampling import pattern_law
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.spec import AnalysisSpec, spec_from_dict

T0 = 1_700_000_000_000
HOUR_MS = 3_600_000
D, TAU = 8, 2


def fragment_spec(eps_b: float = 1.0, d: int = D, fragments: int = TAU, **changes) -> AnalysisSpec:
    spec = spec_from_dict({"analysis": {"name": "frag", "metric": "frag"}, "domain": {"size": d},
                           "mechanism": {"name": "rappor_fragments", "epsilon": eps_b, "fragments": fragments,
                                         "epsilon_fragment": 15.0}})
    return dataclasses.replace(spec, **changes) if changes else spec


def events(clients: list[str], windows: int, value: int = 5) -> list[KafkaRecord]:
    """One event per client and hourly window, each at its own Kafka offset (as 40 separate runs would see)."""
    out = []
    for w in range(windows):
        for client in clients:
            event = {"schema_version": SCHEMA_VERSION, "client_id": client, "event_time": T0 + w * HOUR_MS,
                     "metric": "frag", "value": value}
            out.append(KafkaRecord("telemetry", 0, len(out), T0 + w * HOUR_MS, None,
                                   encode_record("TelemetryEvent", event)))
    return out


def backstops_seen(tmp_path: Path, spec: AnalysisSpec, records: list[KafkaRecord], keys) -> dict[str, set]:
    """Per client, the distinct backstops its reports show (every fragment of a report must show the same)."""

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        reports, dead = p | beam.Create(records) | EncodeEvents([spec], keys, max_batch_size=16)
        return {"reports": reports | beam.FlatMap(lambda batch: batch), "dead": dead}

    run = run_pipeline(tmp_path, build)
    assert run.values("dead") == []
    per_event: dict[tuple[str, int], list[int]] = defaultdict(list)
    for report in run.values("reports"):
        per_event[(report.client_id, report.source.offset)].append(report.channel)
    seen: dict[str, set] = defaultdict(set)
    for (client, _), channels in per_event.items():
        ch = np.array([c for c in channels if c >= 0])
        fragments = [tuple(sorted((ch[ch // D == i] % D).tolist())) for i in range(TAU)]
        assert all(f == fragments[0] for f in fragments)
        seen[client].add(fragments[0])
    return seen


def test_one_backstop_per_device_over_40_windows_retries_and_reruns(tmp_path):
    clients = [f"device-{i}" for i in range(6)]
    keys = EncoderKeys.from_seed(7)
    first = backstops_seen(tmp_path, spec := fragment_spec(), events(clients, 40), keys)
    assert {c: len(s) for c, s in first.items()} == dict.fromkeys(clients, 1)  # was 16 distinct in 40 windows
    # A rerun (other offsets, other batches) with the same encoder secret: the very same backstops.
    rerun = backstops_seen(tmp_path, spec, events(clients, 3)[::-1], keys)
    assert rerun == first
    # Devices do not share one: eps_b = 1, d = 8, two independent backstops coincide with probability 0.018.
    assert len({next(iter(s)) for s in first.values()}) >= 4
    # Another encoder secret draws other backstops (as a reinstall of every device would).
    other = backstops_seen(tmp_path, spec, events(clients, 1), EncoderKeys.from_seed(8))
    assert sum(other[c] != first[c] for c in clients) >= 4


def test_only_the_backstop_parameters_key_the_prf():
    """A [crowd] epsilon or lateness edit keeps every backstop; a new eps_b or d redraws; a new metric too."""
    keys = EncoderKeys.from_seed(3).backstop
    devices = [f"d{i}" for i in range(64)]
    values = np.arange(64) % 4

    def draw(spec: AnalysisSpec) -> np.ndarray:
        return prf_backstops(keys, spec.metric, spec.randomizer, devices, values)

    base = draw(spec := fragment_spec())
    same = [fragment_spec(crowd=dataclasses.replace(spec.crowd, epsilon=0.25)),
            fragment_spec(allowed_lateness_seconds=600), fragment_spec(window_seconds=86400)]
    for edited in same:
        assert edited.spec_id != spec.spec_id and np.array_equal(draw(edited), base)
    identity = backstop_identity(spec.metric, spec.randomizer)
    assert backstop_identity("frag", fragment_spec(fragments=3).randomizer) == identity  # only the fragments differ
    for changed in (fragment_spec(eps_b=1.5), fragment_spec(d=9), fragment_spec(metric="other")):
        # a new law or metric is a new PRF input (with the same uniforms, rows of a new eps_b could coincide)
        assert backstop_identity(changed.metric, changed.randomizer) != identity
        redrawn = draw(changed)
        rows = [tuple(r[r < changed.d]) for r in redrawn]
        # each row coincides with probability < 0.02: far fewer than half of 64 can
        assert sum(row != tuple(b[b < D]) for row, b in zip(rows, base, strict=True)) > 32


def test_prf_backstops_follow_the_randomized_response_law():
    """Across devices the PRF's backstops of value 1 are RR(one-hot(1); eps_b) exactly: 2^3 patterns over 8000
    devices, binomial z-scores (ldp_helpers' tolerance)."""
    spec = fragment_spec(eps_b=1.0, d=3)
    mech = spec.randomizer
    assert mech.backstop_cap == 3  # no truncation at d = 3
    n = 8000
    rows = prf_backstops(EncoderKeys.from_seed(11).backstop, "frag", mech, [f"d{i}" for i in range(n)],
                         np.ones(n, dtype=np.int64))
    patterns = np.zeros(n, dtype=np.int64)
    for j in range(3):
        patterns |= (rows == j).any(axis=1).astype(np.int64) << j
    probs = np.full(3, mech.q_backstop)
    probs[1] = 1.0 - mech.q_backstop
    assert_counts_follow_law(np.bincount(patterns, minlength=8), pattern_law(probs), n, "backstop law")


def _rfc5869(secret: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 written out from RFC 5869 with hmac, independent of the library the encoder uses."""
    prk = hmac.new(SALT, secret, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


def test_encoder_sub_keys_are_labelled_hkdf_outputs_distinct_and_stable(tmp_path):
    secret = os.urandom(32)
    keys = EncoderKeys.derive(secret)
    parts = {name: getattr(keys, name) for name in LABELS}
    for name, (label, length) in LABELS.items():
        assert parts[name] == _rfc5869(secret, label, length) and len(parts[name]) == length
    assert len({v[:16] for v in parts.values()}) == 3  # pairwise different, also on their common prefix
    assert all(secret[i:i + 8] not in v for v in parts.values() for i in range(25))  # no raw secret bytes reused
    assert EncoderKeys.derive(secret) == keys  # stable: the same secret, the same sub-keys
    on_disk = EncoderKeys.from_keys_dir(tmp_path)  # creates keys/encoder/prf.key once, then reads it back
    assert EncoderKeys.from_keys_dir(tmp_path) == on_disk != keys
    assert EncoderKeys.derive((tmp_path / "encoder" / "prf.key").read_bytes()) == on_disk
    assert EncoderKeys.from_seed(5) == EncoderKeys.derive(job_key_from_seed(5))
    assert "bytes" not in repr(keys) and secret.hex() not in repr(keys)
    for bad in (b"short", b"x" * 65, "not bytes"):
        with pytest.raises(ValueError, match="16 bytes"):
            EncoderKeys.derive(bad)
