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
from apache_beam.metrics import Metrics

from transforms.device.wire import EventRows, ShufflerKey, signed_message_sets
from transforms.encoder.keys import EncoderKeys
from transforms.runtime.worker_gc import tune_worker_gc
from transforms.spec import AnalysisSpec, SpecSet
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_analyzer_public, load_shuffler_sealing_public
from transforms.wire.elements import ReportElement

NAMESPACE = "esa"


def _prf(key: bytes, *parts: bytes) -> bytes:
    """32 pseudo-random bytes bound to ``parts`` (BLAKE2b keyed with the encoder's sealing sub-key)."""
    h = hashlib.blake2b(key=key[:64], digest_size=32)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


class SealSetsFn(beam.DoFn):
    """Lists of ReportElements (one spec; one event's messages consecutive) -> (device id, MessageSet bytes).

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

    def process(self, batch: list[ReportElement]) -> Iterator[list[tuple[bytes, bytes]]]:
        sets: list[list[ReportElement]] = []
        start = 0
        while start < len(batch):
            stop = start + 1
            while stop < len(batch) and batch[stop].source == batch[start].source:
                stop += 1
            sets.append(batch[start:stop])
            start = stop
        if sets:
            self._sets.inc(len(sets))
            yield self._seal_all(sets)

    def _seal_all(self, sets: list[list[ReportElement]]) -> list[tuple[bytes, bytes]]:
        self._fleet.prepare((reports[0].client_id for reports in sets), self._threads)
        events = []
        for reports in sets:
            first = reports[0]
            position = _position(first)
            events.append(EventRows(
                self._specs[first.spec_id], [r.payload for r in reports], first.event_time_ms, first.crowd_id,
                self._fleet.device_id(first.client_id), self._fleet.signing_key(first.client_id),
                _prf(self._prf_key, b"nonce", position)[:16],
                [_prf(self._prf_key, b"ephemeral", position, i.to_bytes(4, "big")) for i in range(len(reports))],
                _prf(self._prf_key, b"envelope", position)))
        sealed = signed_message_sets(events, self._analyzer, self._key_id, self._shuffler, self._threads)
        return [(event.device_id.encode(), data) for event, data in zip(events, sealed, strict=True)]


def _position(first: ReportElement) -> bytes:
    """The event's Kafka position: what its set's nonce and ephemerals are derived from."""
    source = first.source
    return f"{source.topic}/{source.partition}/{source.offset}".encode() if source else b"?"
