"""Edge encoder, last step: randomized reports -> signed message sets with payloads sealed to the analyzer.

What a device does before anything leaves it (``transforms.device`` is the on-device library; this DoFn does
the same for edge collectors and simulations, which hold the simulated devices' keys): every message of one
event is sealed on its own to the analyzer's public key, with the routing fields that survive the shuffle
(spec, crowd, window end, channel) as associated data, and the set is signed with the device's key, and the
encoded set is sealed whole to the shuffler (nested encryption: the reports topic never holds the blobs the
shuffler releases). Sealing ephemerals (both layers) and the set's nonce come from a keyed PRF of the event's
Kafka position under the encoder's sealing sub-key (``transforms.encoder.keys``), so a retried or rerun bundle
sends byte-identical sets (the shuffler keeps one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from transforms.device.wire import EventRows, ShufflerKey, signed_message_sets
from transforms.encoder.encode import EventElement, ReportBatch
from transforms.encoder.keys import EncoderKeys
from transforms.runtime.worker_gc import tune_worker_gc
from transforms.spec import AnalysisSpec, SpecSet
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_analyzer_public, load_shuffler_sealing_public

NAMESPACE = "esa"


def _prf(key: bytes, *parts: bytes) -> bytes:
    """32 pseudo-random bytes bound to ``parts`` (BLAKE2b keyed with the encoder's sealing sub-key)."""
    h = hashlib.blake2b(key=key[:64], digest_size=32)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


class SealSetsFn(beam.DoFn):
    """ReportBatches (one spec, in arrays) -> lists of (device id, MessageSet bytes), one set per event.

    A whole input batch is sealed and signed at once: the GIL-free calls (key expansion, the two X25519
    multiplications per message, the signature) run on ``threads`` (``transforms.runtime.parallel``), everything in
    Python on this thread (``transforms.device.wire.signed_message_sets``, what a device client sends too).
    """
    def __init__(self, specs: list[AnalysisSpec], keys_dir: str, threads: int = 0, python_gc: str = "tuned"):
        self._specs = SpecSet(specs)
        self._keys_dir = keys_dir
        self._threads = threads
        self._python_gc = python_gc  # transforms.runtime.worker_gc
        self._sets = Metrics.counter(NAMESPACE, "sets_sealed")
        self._fleet: Any = None

    def setup(self) -> None:
        tune_worker_gc(self._python_gc)

        keys = Path(self._keys_dir)
        self._fleet = SimulatedFleet.from_keys_dir(keys)
        self._key_id, self._analyzer = load_analyzer_public(keys)
        self._shuffler = ShufflerKey(*load_shuffler_sealing_public(keys))
        self._prf_key = EncoderKeys.from_keys_dir(keys).seal

    def process(self, batch: ReportBatch) -> Iterator[list[tuple[bytes, bytes]]]:
        sets = list(batch.sets())
        if sets:
            self._sets.inc(len(sets))
            yield self._seal_all(self._specs[batch.spec_id], sets, batch.wire)

    def _seal_all(self, spec: AnalysisSpec, sets: list[tuple[EventElement, np.ndarray]], wire: np.ndarray
                  ) -> list[tuple[bytes, bytes]]:
        self._fleet.prepare((event.client_id for event, _ in sets), self._threads)
        events = []
        for event, rows in sets:
            position = _position(event)
            events.append(EventRows(
                spec, rows, event.event_time_ms, event.crowd_id,
                self._fleet.device_id(event.client_id), self._fleet.signing_key(event.client_id),
                _prf(self._prf_key, b"nonce", position)[:16],
                [_prf(self._prf_key, b"ephemeral", position, i.to_bytes(4, "big")) for i in range(len(rows))],
                _prf(self._prf_key, b"envelope", position)))
        sealed = signed_message_sets(events, self._analyzer, self._key_id, self._shuffler, self._threads, wire)
        return [(event.device_id.encode(), data) for event, data in zip(events, sealed, strict=True)]


def _position(event: EventElement) -> bytes:
    """The event's Kafka position: what its set's nonce and ephemerals are derived from."""
    source = event.source
    return f"{source.topic}/{source.partition}/{source.offset}".encode() if source else b"?"
