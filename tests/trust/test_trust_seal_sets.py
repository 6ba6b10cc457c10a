"""The encoder's batched sealing and signing (``SealSetsFn``: GIL-free calls on a thread pool) makes, set for
set, the bytes the one-set-at-a-time device path (``signed_message_set``) makes, on every pool size; and what
it makes opens and verifies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trust_helpers import make_trust

from pipelines.demo.population import avro_value, synthesize
from pipelines.examples import example_path
from transforms.device.wire import ShufflerKey, signed_message_set
from transforms.encoder.encode import EventElement, ReportBatch
from transforms.encoder.keys import EncoderKeys
from transforms.encoder.seal import SealSetsFn, _prf
from transforms.mechanisms.base import encode_messages
from transforms.spec import load_spec
from transforms.trust import DeviceRegistry, decode_message_set, open_sealed, verify_message_set
from transforms.trust.envelope import open_envelope
from transforms.trust.keys import load_or_create_secret, load_shuffler_sealing_private, load_shuffler_sealing_public
from transforms.trust.sealing import associated_data
from transforms.wire.elements import SourceRef
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.rows import client_messages


def _report_batch(spec, n: int) -> ReportBatch:
    """n events' reports as the encoder's randomizer emits them (arrays): each event's messages consecutive."""
    rng = np.random.default_rng(3)
    population = synthesize(spec, n, seed=5)
    mechanism = spec.randomizer
    values = [event_value(spec, avro_value(spec, v)) for v in population.values]
    wire, owner = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, values, rng), rng),
                                  n_clients=n)
    crowds = population.crowd_ids
    events = [EventElement(spec.spec_id, str(population.client_ids[i]), int(population.event_times_ms[i]), None,
                           SourceRef("raw", i % 3, 100 + i), b"", None if crowds is None else str(crowds[i]))
              for i in range(n)]
    return ReportBatch(spec.spec_id, wire, owner, events)


@pytest.mark.parametrize("spec_file", ["app_language.toml", "app_language_multimessage.toml", "grid.toml"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_batched_sets_are_the_device_path_bytes(tmp_path: Path, spec_file: str, threads: int) -> None:
    trust = make_trust(tmp_path / "keys")
    spec = load_spec(example_path(spec_file))
    batch = _report_batch(spec, 30)
    sealer = SealSetsFn([spec], str(trust.keys_dir), threads)
    sealer.setup()
    (out,) = list(sealer.process(batch))
    batch = list(batch)  # the per-report view, for the one-set-at-a-time device path
    prf_key = EncoderKeys.derive(load_or_create_secret(trust.keys_dir / "encoder" / "prf.key")).seal
    firsts = [i for i, r in enumerate(batch) if i == 0 or r.source != batch[i - 1].source]
    assert len(out) == len(firsts) == 30
    registry = DeviceRegistry()
    for (device_key, data), start, stop in zip(out, firsts, [*firsts[1:], len(batch)], strict=True):
        reports = batch[start:stop]
        first = reports[0]
        position = f"{first.source.topic}/{first.source.partition}/{first.source.offset}".encode()
        want = signed_message_set(
            spec, [r.payload for r in reports], event_time_ms=first.event_time_ms, crowd_id=first.crowd_id,
            device_id=trust.fleet.device_id(first.client_id), signer=trust.fleet.signing_key(first.client_id),
            analyzer=trust.analyzer_public, key_id=trust.analyzer_id,
            shuffler=ShufflerKey(*load_shuffler_sealing_public(trust.keys_dir)),
            nonce=_prf(prf_key, b"nonce", position)[:16],
            ephemerals=[_prf(prf_key, b"ephemeral", position, i.to_bytes(4, "big")) for i in range(len(reports))],
            envelope_ephemeral=_prf(prf_key, b"envelope", position))
        assert data == want
        ms = decode_message_set(open_envelope(load_shuffler_sealing_private(trust.keys_dir), data))
        assert device_key == ms.device_id.encode()
        trust.fleet.enroll(registry, [first.client_id])
        verify_message_set(ms, registry)
        window = spec.window_seconds * 1000
        end = (first.event_time_ms // window + 1) * window
        for m in ms.messages:  # raises unless each opens under its own routing fields
            open_sealed(trust.analyzer_private, m.sealed, associated_data(spec.spec_id, first.crowd_id, end, m.channel))
