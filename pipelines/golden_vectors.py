"""Golden vectors of the device wire: what the Python client sends, step by step, under injected randomness.

Every device SDK (``clients/web`` in TypeScript) replays them and must produce the same bytes at every step:
the spec export, the randomizer's output under the recorded coins, each padded payload plaintext, its
associated data, each message sealed to the analyzer, the signing bytes, the Ed25519 signature, the encoded
MessageSet, the envelope sealed to the shuffler, and the budget ledger after each report.

How the randomness is injected: the real ``transforms.device.Client`` runs with a ``RecordingRandom`` in place
of its Generator, which draws from a fixed-seed numpy Generator and records every draw in order
(``random``, ``integers``, ``bytes``: coins, then one ephemeral key per message, the nonce, the envelope's
ephemeral key). An SDK replays that list in order and fails on the first draw it asks for differently, so
the vectors pin the order and shape of the draws as well as the arithmetic. The device, analyzer and
shuffler keys come from fixed seeds.

``python -m pipelines.golden_vectors`` rewrites ``schemas/vectors/*.json``; ``--check`` compares instead
(exit 1 on a difference); ``tests/device/test_golden_vectors.py`` runs the check.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transforms.device.budget import BUDGET_FILE, Budget
from transforms.device.client import Client
from transforms.device.spec_export import spec_json
from transforms.device.wire import window_end_ms
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.trust.ed25519 import SodiumSigner
from transforms.trust.envelope import open_envelope
from transforms.trust.message_set import MESSAGE_SET_TAG, decode_message_set, messages_bytes, signing_bytes
from transforms.trust.sealing import associated_data, open_sealed

VECTORS_DIR = Path(__file__).resolve().parent.parent / "schemas" / "vectors"
FORMAT = 1
ANALYZER_KEY_ID = "20261201-a11a1a2e"
SHUFFLER_KEY_ID = "20261201-5aff1e00"
ANALYZER_SEED = bytes(range(1, 33))
SHUFFLER_SEED = bytes(range(101, 133))
DEVICE_SEED = bytes(range(201, 233))
NOW = 1_764_000_000.0  # the device clock (2025-11-24T16:00:00Z)
BUDGET = Budget(epsilon_per_epoch=40.0, epoch_seconds=86400)

_LANGUAGES = ["en", "zh", "es", "hi", "ar", "pt", "bn", "ru", "ja", "de", "fr", "ko"]


def _histogram(name: str, mechanism: str, epsilon: float, partition: str | None = None, **params: Any
               ) -> AnalysisSpec:
    raw: dict[str, Any] = {"analysis": {"name": name, "kind": "histogram", "metric": name},
                           "domain": {"categories": _LANGUAGES},
                           "mechanism": {"name": mechanism, "epsilon": epsilon, **params},
                           "window": {"size_seconds": 3600}}
    if partition is not None:
        raw["crowd"] = {"partition": partition}
    return spec_from_dict(raw)


def _range(name: str, oracle: str, levels: str, bits: int, epsilon: float) -> AnalysisSpec:
    return spec_from_dict({"analysis": {"name": name, "kind": "range", "metric": "latency_ms"},
                           "domain": {"bits": bits, "value_range": [0.0, 2000.0]},
                           "mechanism": {"name": "dyadic_range", "epsilon": epsilon, "oracle": oracle,
                                         "levels": levels},
                           "window": {"size_seconds": 600}})


def cases() -> list[tuple[str, AnalysisSpec, list[dict[str, Any]]]]:
    """(case name, spec, events): every mechanism the web SDK implements, with crowds, both range level modes
    and every range oracle."""
    t = int(NOW * 1000)
    three = [{"value": "fr", "event_time_ms": t - 5_000}, {"value": 3, "event_time_ms": t - 3_599_000},
             {"value": "en", "event_time_ms": t}]
    return [
        ("grr", _histogram("lang_grr", "grr", 1.5), three),
        ("grr_crowd", _histogram("lang_grr_crowd", "grr", 3.0, partition="app_version"),
         [{"value": "ko", "event_time_ms": t, "crowd_id": "7.1.0"}, {"value": "ja", "event_time_ms": t + 1,
                                                                   "crowd_id": "é-unicode"}]),
        ("oue", _histogram("lang_oue", "oue", 2.0), three),
        ("olh", _histogram("lang_olh", "olh", 2.0), three),
        ("olh_small_family", _histogram("lang_olh_small", "olh", 0.5, g=3, seed_family=64), three),
        ("rappor_fragments", _histogram("lang_fragments", "rappor_fragments", 4.0, fragments=3),
         [{"value": "es", "event_time_ms": t}, {"value": "es", "event_time_ms": t + 3_600_000},
          {"value": 11, "event_time_ms": t + 1}, {"value": "es", "event_time_ms": t + 2}]),
        ("range_llh_sample", _range("lat_llh", "llh", "sample", 16, 4.0),
         [{"value": 12.5, "event_time_ms": t}, {"value": 2000.0, "event_time_ms": t},
          {"value": 0, "event_time_ms": t}]),
        ("range_grr_all", _range("lat_grr", "grr", "all", 6, 3.0), [{"value": 777.7, "event_time_ms": t},
                                                                      {"value": 1999.0, "event_time_ms": t}]),
        ("range_olh_sample", _range("lat_olh", "olh", "sample", 8, 2.0), three_range(t)),
        ("range_oue_all", _range("lat_oue", "oue", "all", 5, 4.0), three_range(t)),
    ]


def three_range(t: int) -> list[dict[str, Any]]:
    return [{"value": 1.0, "event_time_ms": t}, {"value": 1234.5, "event_time_ms": t - 1},
            {"value": 600, "event_time_ms": t + 7}]


class RecordingRandom:
    """The client's randomness: a fixed-seed numpy Generator whose every draw is recorded, in order."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.draws: list[dict[str, Any]] = []

    def random(self, size: Any) -> np.ndarray:
        out = self._rng.random(size)
        self.draws.append({"op": "random", "shape": list(out.shape), "values": out.ravel().tolist()})
        return out

    def integers(self, low: Any, high: Any, size: Any) -> np.ndarray:
        out = self._rng.integers(low, high, size)
        self.draws.append({"op": "integers", "low": np.asarray(low).tolist(), "high": np.asarray(high).tolist(),
                           "shape": list(out.shape), "values": out.ravel().tolist()})
        return out

    def bytes(self, size: int) -> bytes:
        out = self._rng.bytes(size)
        self.draws.append({"op": "bytes", "n": size, "hex": out.hex()})
        return out


def _x25519(seed: bytes) -> tuple[X25519PrivateKey, str]:
    key = X25519PrivateKey.from_private_bytes(seed)
    return key, key.public_key().public_bytes_raw().hex()


def _event_vector(spec: AnalysisSpec, event: dict[str, Any], draws: list[dict[str, Any]], output: bytes,
                  ledger: dict[str, Any]) -> dict[str, Any]:
    """Every intermediate of one report, recovered from its output with the private keys (so each step can be
    compared on its own)."""
    analyzer, _ = _x25519(ANALYZER_SEED)
    shuffler, _ = _x25519(SHUFFLER_SEED)
    encoded = open_envelope({SHUFFLER_KEY_ID: shuffler}, output)
    ms = decode_message_set(encoded)
    end = window_end_ms(spec, ms.event_time_ms)
    messages = []
    for message in ms.messages:
        ad = associated_data(ms.spec_id, ms.crowd_id, end, message.channel)
        plaintext = open_sealed({ANALYZER_KEY_ID: analyzer}, message.sealed, ad)
        messages.append({"channel": message.channel, "plaintext": plaintext.hex(), "associated_data": ad.hex(),
                         "sealed": message.sealed.hex()})
    signed = signing_bytes(ms)
    assert signed.endswith(messages_bytes(ms.messages)) and MESSAGE_SET_TAG in signed
    return {"input": event, "draws": draws, "window_end_ms": end, "nonce": ms.nonce.hex(), "messages": messages,
            "signing_bytes": signed.hex(), "signature": ms.signature.hex(), "message_set": encoded.hex(),
            "envelope": output.hex(), "ledger": ledger}


def build_case(name: str, spec: AnalysisSpec, events: Sequence[dict[str, Any]], seed: int) -> dict[str, Any]:
    """One vector file: the spec export, the keys, and each event's draws and bytes from a fresh device."""
    _, analyzer_public = _x25519(ANALYZER_SEED)
    shuffler_key, shuffler_public = _x25519(SHUFFLER_SEED)
    analyzer_key, _ = _x25519(ANALYZER_SEED)
    signer = SodiumSigner(DEVICE_SEED)
    rng = RecordingRandom(seed)
    out_events = []
    with tempfile.TemporaryDirectory(prefix="esa-vectors-") as state:
        client = Client(spec, state, analyzer_public_key=analyzer_key.public_key(), analyzer_key_id=ANALYZER_KEY_ID,
                        shuffler_public_key=shuffler_key.public_key(), shuffler_key_id=SHUFFLER_KEY_ID,
                        budget=BUDGET, signing_key=signer, rng=rng,  # type: ignore[arg-type]
                        clock=lambda: NOW)
        for event in events:
            start = len(rng.draws)
            output = client.encode(event["value"], event_time_ms=event["event_time_ms"],
                                   crowd_id=event.get("crowd_id"))
            ledger = json.loads((Path(state) / BUDGET_FILE).read_text())
            memo = {p.name: json.loads(p.read_text()) for p in sorted((Path(state) / "memo").glob("*.json"))}
            out_events.append({**_event_vector(spec, event, rng.draws[start:], output, ledger), "memo": memo})
    return {"format": FORMAT, "case": name, "generator": "python -m pipelines.golden_vectors",
            "spec": spec_json(spec),
            "keys": {"device_seed": DEVICE_SEED.hex(), "device_public": signer.public_bytes_raw().hex(),
                     "device_id": client.device_id,
                     "analyzer_key_id": ANALYZER_KEY_ID, "analyzer_public": analyzer_public,
                     "analyzer_private": ANALYZER_SEED.hex(),
                     "shuffler_key_id": SHUFFLER_KEY_ID, "shuffler_public": shuffler_public,
                     "shuffler_private": SHUFFLER_SEED.hex()},
            "budget": {"epsilon_per_epoch": BUDGET.epsilon_per_epoch, "epoch_seconds": BUDGET.epoch_seconds,
                       "now": NOW},
            "events": out_events}


def render(vector: dict[str, Any]) -> str:
    return json.dumps(vector, indent=1, sort_keys=True) + "\n"


def all_vectors() -> dict[str, str]:
    """File name -> text of every vector file."""
    return {f"{name}.json": render(build_case(name, spec, events, seed=1000 + i))
            for i, (name, spec, events) in enumerate(cases())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.golden_vectors", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with schemas/vectors instead of writing")
    parser.add_argument("--dir", type=Path, default=VECTORS_DIR)
    args = parser.parse_args(argv)
    expected = all_vectors()
    if args.check:
        stale = [name for name, body in expected.items()
                 if not (args.dir / name).is_file() or (args.dir / name).read_text() != body]
        extra = sorted(p.name for p in args.dir.glob("*.json") if p.name not in expected)
        for name in stale + extra:
            print(f"golden vector differs: {name}", file=sys.stderr)
        return 1 if stale or extra else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, body in expected.items():
        (args.dir / name).write_text(body)
    print(f"wrote {len(expected)} vector files to {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
