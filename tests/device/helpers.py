"""Shared pieces of the device tests: tiny specs, an analyzer key pair, and the analyzer's view of a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.trust.envelope import open_envelope
from transforms.trust.files import atomic_write, ensure_dir
from transforms.trust.message_set import MessageSet, decode_message_set
from transforms.trust.sealing import associated_data, open_sealed
from transforms.wire.avro_payload import decode_payload
from transforms.wire.rows import PayloadRow

KEY_ID = "20260101-0badcafe"
ANALYZER = X25519PrivateKey.from_private_bytes(bytes(range(32)))
SHUFFLER_KEY_ID = "20260101-5e1f5e1f"
SHUFFLER = X25519PrivateKey.from_private_bytes(bytes(range(32, 64)))
DAY = 86400.0
T0 = 1_764_000_000.0  # a fixed "now" (2025-11-24T16:00:00Z), far from an epoch boundary


def histogram_spec(mechanism: str, epsilon: float, d: int = 3, name: str = "tiny", window_seconds: int = 3600,
                   **params: Any) -> AnalysisSpec:
    return spec_from_dict({"analysis": {"name": name, "kind": "histogram"}, "domain": {"size": d},
                           "mechanism": {"name": mechanism, "epsilon": epsilon, **params},
                           "window": {"size_seconds": window_seconds}})


def client_kwargs(**extra: Any) -> dict[str, Any]:
    return {"analyzer_public_key": ANALYZER.public_key(), "analyzer_key_id": KEY_ID,
            "shuffler_public_key": SHUFFLER.public_key(), "shuffler_key_id": SHUFFLER_KEY_ID, **extra}


def shuffler_keys_dir(root: Path) -> str:
    """A keys directory holding the shuffler's sealing key (``SHUFFLER``), for an ``IngressFn``."""
    atomic_write(ensure_dir(root / "shuffler") / f"{SHUFFLER_KEY_ID}.x25519", SHUFFLER.private_bytes_raw())
    return str(root)


def peel(data: bytes) -> bytes:
    """The shuffler's first step: the encoded message set inside a client's output."""
    return open_envelope({SHUFFLER_KEY_ID: SHUFFLER}, data)


def open_report(spec: AnalysisSpec, data: bytes) -> tuple[MessageSet, list[PayloadRow]]:
    """The analyzer's side: decode the set, open every sealed message with the routing fields that survive the
    shuffle, and turn each plaintext back into a checked wire row."""
    ms = decode_message_set(peel(data))
    window_ms = spec.window_seconds * 1000
    window_end = (ms.event_time_ms // window_ms + 1) * window_ms
    rows = []
    for message in ms.messages:
        plain = open_sealed({KEY_ID: ANALYZER}, message.sealed,
                            associated_data(ms.spec_id, ms.crowd_id, window_end, message.channel))
        rows.append(decode_payload(spec.randomizer, plain, message.channel))
    return ms, rows
