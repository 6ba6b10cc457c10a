"""Helpers of the trust tests: a fresh keys directory with a small enrolled simulated fleet, signed sets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from transforms.trust import (
    DeviceRegistry,
    MessageSet,
    SealedMessage,
    SimulatedFleet,
    associated_data,
    init_keys,
    load_analyzer_private,
    load_analyzer_public,
    load_shuffler_signer,
    load_shuffler_verifiers,
    seal,
    sign_message_set,
)

SPEC = "app_language@0123456789ab"
CROWD = "v1.2"
WINDOW_END = 1_700_002_800_000
EVENT_TIME = 1_700_000_123_456


@dataclass
class Trust:
    keys_dir: Path
    analyzer_id: str
    analyzer_public: X25519PublicKey
    analyzer_private: dict[str, X25519PrivateKey]
    shuffler_id: str
    shuffler_signer: Ed25519PrivateKey
    shuffler_verifiers: dict[str, Ed25519PublicKey]
    fleet: SimulatedFleet
    registry: DeviceRegistry

    def message_set(self, client: str, payloads: list[tuple[int, bytes]], crowd: str | None = CROWD,
                    nonce: bytes = b"n" * 16) -> MessageSet:
        sealed = tuple(SealedMessage(ch, seal(self.analyzer_public, self.analyzer_id, p,
                                              associated_data(SPEC, crowd, WINDOW_END, ch)))
                       for ch, p in payloads)
        ms = MessageSet(SPEC, crowd, self.fleet.device_id(client), EVENT_TIME, nonce, self.analyzer_id, sealed)
        return sign_message_set(ms, self.fleet.signing_key(client))


def make_trust(keys_dir: Path) -> Trust:
    init_keys(keys_dir)
    analyzer_id, analyzer_public = load_analyzer_public(keys_dir)
    shuffler_id, signer = load_shuffler_signer(keys_dir)
    fleet = SimulatedFleet.from_keys_dir(keys_dir)
    registry = DeviceRegistry()
    fleet.enroll(registry, ["alice", "bob"])
    return Trust(keys_dir, analyzer_id, analyzer_public, load_analyzer_private(keys_dir), shuffler_id, signer,
                 load_shuffler_verifiers(keys_dir), fleet, registry)
