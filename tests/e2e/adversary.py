"""The attacker of the adversarial suite: write access to a topic, the public keys, none of the secrets.

Everything an attacker can build is built here: well-formed message sets sealed to the analyzer's public
key and signed with keys the attacker made (never enrolled), replays of records read off a topic, and
release batches signed with a key the analyzer does not know. The test-side "honest" helpers (a shared
``Stage`` laying out OUTPUT_DIR, STATE and KEYS apart, configs with a pinned clock) live here too.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipelines.demo.population import avro_value
from pipelines.job_config import JobConfig
from schemas import encode_record  # noqa: F401  (schemas before trust's encoders)
from transforms.device.wire import window_end_ms
from transforms.io.kafka.bounded import KafkaRecord, produce_records, read_topic
from transforms.mechanisms.base import encode_messages
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.state.estimates_store import read_estimates
from transforms.trust.devices import device_id_of
from transforms.trust.envelope import open_envelope, seal_envelope
from transforms.trust.keys import load_analyzer_public, load_shuffler_sealing_private, load_shuffler_sealing_public
from transforms.trust.message_set import (
    MessageSet,
    SealedMessage,
    decode_message_set,
    encode_message_set,
    sign_message_set,
)
from transforms.trust.release import ReleaseBatch, encode_release_batch, release_id_of, sign_release_batch
from transforms.trust.sealing import associated_data, seal
from transforms.wire.avro_payload import encode_payload
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.rows import array_to_rows, client_messages, row_channel

HOUR_MS = 3_600_000


def histogram_spec(name: str, *, d: int = 8, crowd: str | None = None, min_clients: int = 10) -> AnalysisSpec:
    """A small GRR histogram with hourly windows (optionally split into crowds by ``crowd``)."""
    crowd_table: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-6, "min_clients": min_clients}
    if crowd:
        # a partition charges the crowd count for a year of hourly windows; 30 (the most a spec allows) keeps
        # its threshold near 195 deletions (sigma ~31), so a test's honest crowd of a few hundred releases
        crowd_table.update(partition=crowd, epsilon_year=30.0)
    return spec_from_dict({"analysis": {"name": name, "metric": name}, "domain": {"size": d},
                           "mechanism": {"name": "grr", "epsilon": 2.0}, "window": {"size_seconds": 3600},
                           "crowd": crowd_table}, source="test")


@dataclass(frozen=True)
class Stage:
    """One deployment: OUTPUT_DIR (the analyst's), STATE and KEYS outside it, and its topics."""

    base: Path
    bootstrap: str
    spec: AnalysisSpec
    now_ms: int
    topics: dict[str, str]
    keys_dir: Path | None = None  # default: base/keys (outside OUTPUT_DIR)

    @property
    def out(self) -> Path:
        return self.base / "out"

    @property
    def keys(self) -> Path:
        return self.keys_dir or self.base / "keys"

    def config(self, stage: str, *, state: str = "state", out: str = "out", keys: Path | None = None,
               **overrides: Any) -> JobConfig:
        """The JobConfig of one job of this deployment (each stage its own state directory)."""
        config = JobConfig(bootstrap=self.bootstrap, specs=(self.spec,), out_dir=self.base / out,
                           state_dir=self.base / state, keys_dir=keys or self.keys, group_id=f"g-{self.base.name}",
                           seed=7, drain=True, now_ms=self.now_ms, create_topics=True, **self.topics)
        return replace(config.for_stage(stage), **overrides)


def attacker_key() -> tuple[str, Ed25519PrivateKey]:
    """A fresh Ed25519 key and the well-formed device id it would have (never enrolled)."""
    key = Ed25519PrivateKey.generate()
    return device_id_of(key.public_key().public_bytes_raw()), key


def forged_set(spec: AnalysisSpec, keys_dir: Path, *, device_id: str, signer: Ed25519PrivateKey, event_time_ms: int,
               category: int, rng: np.random.Generator, crowd_id: str | None = None) -> bytes:
    """A well-formed MessageSet for ``category``, sealed to the analyzer's (public) key, signed by ``signer``."""
    key_id, analyzer = load_analyzer_public(keys_dir)
    mechanism = spec.randomizer
    value = event_value(spec, avro_value(spec, category))
    wire, _ = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, [value], rng), rng),
                               n_clients=1)
    end = window_end_ms(spec, event_time_ms)
    messages = []
    for row in array_to_rows(wire):
        channel = row_channel(mechanism, row)
        messages.append(SealedMessage(channel, seal(analyzer, key_id, encode_payload(mechanism, row),
                                                    associated_data(spec.spec_id, crowd_id, end, channel))))
    unsigned = MessageSet(spec.spec_id, crowd_id, device_id, event_time_ms, os.urandom(16), key_id, tuple(messages))
    return to_shuffler(keys_dir, encode_message_set(sign_message_set(unsigned, signer)))


def to_shuffler(keys_dir: Path, encoded_set: bytes) -> bytes:
    """An encoded set sealed to the shuffler's (public) sealing key, as every sender must."""
    key_id, public = load_shuffler_sealing_public(keys_dir)
    return seal_envelope(public, key_id, encoded_set)


def opened(keys_dir: Path, value: bytes) -> MessageSet:
    """The set inside a reports-topic record (what only the shuffler's private key shows)."""
    return decode_message_set(open_envelope(load_shuffler_sealing_private(keys_dir), value))


def forged_release(spec: AnalysisSpec, messages: Iterable[SealedMessage], *, window_end: int, n_sets: int,
                   key_id: str, signer: Ed25519PrivateKey, crowd_id: str | None = None,
                   max_bytes: int | None = None) -> list[bytes]:
    """The encoded, signed batches of a release (split small when ``max_bytes`` is given)."""
    from transforms.trust.release import split_into_batches

    msgs = list(messages)
    chunks = split_into_batches(msgs, max_bytes) if max_bytes else [tuple(msgs)]
    rid = release_id_of(spec.spec_id, crowd_id, window_end)
    return [encode_release_batch(sign_release_batch(
        ReleaseBatch(rid, spec.spec_id, crowd_id, window_end, i, len(chunks), n_sets, len(msgs), None, tuple(c)),
        key_id, signer)) for i, c in enumerate(chunks)]


def avro_long(n: int) -> bytes:
    """Avro's zig-zag varint of any integer (also outside int64, which no honest writer produces)."""
    zz = n << 1 if n >= 0 else ((-n) << 1) - 1
    out = bytearray()
    while True:
        byte, zz = zz & 0x7F, zz >> 7
        out.append(byte | (0x80 if zz else 0))
        if not zz:
            return bytes(out)


def with_long(data: bytes, sentinel: int, value: int) -> bytes:
    """``data`` with the encoding of the long ``sentinel`` replaced by ``value``'s (handcrafting out-of-range)."""
    old = avro_long(sentinel)
    assert data.count(old) == 1
    return data.replace(old, avro_long(value))


def copy_topic(bootstrap: str, source: str, target: str) -> list[KafkaRecord]:
    """Re-produce every record of ``source`` (key and bytes) to ``target``; returns what was copied."""
    records = read_topic(bootstrap, source)
    produce_records(bootstrap, target, [(r.key, r.value) for r in records])
    return records


def dead_letters(directory: Path) -> list[dict[str, Any]]:
    """Every dead letter kept under ``directory`` (all runs)."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("dead-letters-*.avro")):
        with path.open("rb") as f:
            out.extend(fastavro.reader(f))
    return out


def reasons(letters: Iterable[dict[str, Any]]) -> Counter[str]:
    """Dead-letter reasons with any detail after the first colon's second part cut (``unauthenticated: x``)."""
    return Counter(str(d["reason"]) for d in letters)


def estimates(out_dir: Path) -> dict[tuple[int, str | None, int], dict[str, Any]]:
    """Estimate rows keyed (window_end, crowd, item_index)."""
    table = read_estimates(out_dir).to_pylist()
    return {(r["window_end"], r["crowd_id"], r["item_index"]): r for r in table}
