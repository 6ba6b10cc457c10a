"""Helpers shared by the end-to-end tests: enrolled populations and hand-made bad message sets.

The shuffler only ever sees signed, sealed message sets, so the bad device traffic a test injects on the
reports topic must be built the way a (misbehaving) device would build it: signed with an enrolled
device's key, or forged on purpose.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipelines.demo.population import Population
from pipelines.demo.simulate import bad_records
from pipelines.enrolment import enrol_simulated
from pipelines.job_config import default_keys_dir
from schemas import encode_record  # noqa: F401  (schemas must import before the trust encoders)
from tests.e2e.adversary import to_shuffler
from transforms.device.wire import window_end_ms
from transforms.spec import AnalysisSpec
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_analyzer_public
from transforms.trust.message_set import MessageSet, SealedMessage, encode_message_set, sign_message_set
from transforms.trust.sealing import associated_data, seal

# Reason fragments of each bad kind ``bad_device_sets`` makes, and where the chain dead-letters it.
SHUFFLER_REASONS = {
    "not sealed to the shuffler": 3,  # an old-style Report (x3 kinds: unknown spec, version 99, out of domain)
    "unknown spec_id": 1,
    "unauthenticated: unknown device": 1,
    "unauthenticated: bad signature": 1,
    "sends exactly one message on channel 0": 1,
    "stale: event time": 1,
}
ENCODER_REASONS = {"not an Avro single-object message": 1, "is not in the domain": 1}
DUPLICATE_REASON = "duplicate: the device already sent 1 set(s) in this window"
UNUSABLE_REASON = "unusable message"


def enrol(out_dir: Path, population: Population, extra: tuple[str, ...] = ()) -> Path:
    """Create the run's keys and enrol the population's devices (plus ``extra`` client ids)."""
    keys = default_keys_dir(Path(out_dir))
    enrol_simulated(keys, [*population.client_ids.tolist(), *extra])
    return keys


def bad_device_sets(keys_dir: Path, spec: AnalysisSpec, population: Population, per_kind: int,
                    seed: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], list[str]]:
    """(bad raw records, bad reports-topic records, client ids to enrol) for a single-message spec.

    Raw (encoder): not Avro, value outside the domain, a second event of an existing client (the shuffler's
    duplicate). Reports (shuffler, per kind): old-format Reports, a set of an unknown spec, a set of a
    device never enrolled, a set altered after signing, a set on a channel the mechanism lacks, a stale
    set; plus a well-signed set whose sealed payload is garbage, which only the analyzer can see.
    """
    old = bad_records(spec, population, per_kind, seed)
    fleet = SimulatedFleet.from_keys_dir(keys_dir)
    key_id, analyzer = load_analyzer_public(keys_dir)
    t0 = int(population.event_times_ms.min())
    end = window_end_ms(spec, t0)
    crowd = population.crowd_ids[0] if population.crowd_ids is not None else None
    reports: list[tuple[bytes, bytes]] = list(old["reports"])
    enrolled: list[str] = []

    def message_set(client: str, *, spec_id: str = spec.spec_id, event_ms: int = t0, channel: int = 0,
                    plaintext: bytes = b"\x00\x01\x00", signer: Ed25519PrivateKey | None = None) -> MessageSet:
        sealed = seal(analyzer, key_id, plaintext, associated_data(spec_id, crowd, end, channel))
        unsigned = MessageSet(spec_id, crowd, fleet.device_id(client), event_ms, bytes(16), key_id,
                              (SealedMessage(channel, sealed),))
        return sign_message_set(unsigned, signer or fleet.signing_key(client))

    def put(ms: MessageSet) -> None:
        reports.append((ms.device_id.encode(), to_shuffler(keys_dir, encode_message_set(ms))))

    for k in range(per_kind):
        client = f"bad-device-{seed}-{k:04d}"
        enrolled.append(client)
        put(message_set(client, spec_id="no-such-analysis@000000000000"))
        stranger = Ed25519PrivateKey.generate()
        put(message_set(f"never-enrolled-{seed}-{k}", signer=stranger))
        put(replace(message_set(client), event_time_ms=t0 + 1))  # altered after signing
        put(message_set(client, channel=3))
        put(message_set(client, event_ms=t0 - 60 * 86400 * 1000))
        garbage = f"garbage-payload-{seed}-{k:04d}"
        enrolled.append(garbage)
        put(message_set(garbage, plaintext=b"\xff" * 7))
    return old["raw"], reports, enrolled
