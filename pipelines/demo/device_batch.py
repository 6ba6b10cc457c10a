"""Simulated devices in bulk: the sealed, signed reports a whole population posts to the edge, made in numpy batches.

What ``device_fleet`` does one ``transforms.device.Client`` at a time (a state directory, a lock and a budget file
per device: ~250 microseconds a report, plus fsyncs with a budget) is done here for a chunk of devices at once:
the randomization is one vectorized ``encode_messages`` call per chunk (the mechanism's own, as on a device), and
sealing and signing is ``transforms.device.wire.signed_message_sets``, the bytes a device client sends, with the
native calls of the chunk on a few threads. No per-device state: each simulated device reports once per run, so
there is no budget to keep; a memoizing mechanism's permanent randomization is the keyed PRF the edge encoder
uses (``transforms.device.backstop.prf_backstops``), stable per (device, value) as a device's memo is.

``esa demo`` posts these to the ingestion edge (``pipelines.edge.client.post_pipelined``), as devices do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipelines.demo.population import Population, avro_value
from transforms.device.backstop import is_memoizing, prf_backstops
from transforms.device.wire import EventRows, ShufflerKey, signed_message_sets
from transforms.encoder.keys import EncoderKeys
from transforms.mechanisms.base import encode_messages
from transforms.mechanisms.randomness import os_entropy_rng, seeded_stream
from transforms.spec import AnalysisSpec
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_analyzer_public, load_shuffler_sealing_public
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.rows import array_to_rows, client_messages

CHUNK = 2048  # devices per batch: large enough for numpy and the thread pool, small enough to overlap the posting


def sealed_reports(spec: AnalysisSpec, population: Population, keys_dir: Path, *, seed: int | None = None,
                   threads: int = 2, chunk: int = CHUNK) -> Iterator[list[bytes]]:
    """Lists of sealed, signed message sets (one per device of the population, in its order), ``chunk`` devices
    at a time. ``seed`` (tests only) fixes the randomization, nonces and ephemeral keys; default OS entropy."""
    keys_dir = Path(keys_dir)
    fleet = SimulatedFleet.from_keys_dir(keys_dir)
    key_id, analyzer = load_analyzer_public(keys_dir)
    shuffler = ShufflerKey(*load_shuffler_sealing_public(keys_dir))
    backstop_key = EncoderKeys.from_keys_dir(keys_dir).backstop if is_memoizing(spec.randomizer) else b""
    n = len(population)
    for index, start in enumerate(range(0, n, chunk)):
        stop = min(start + chunk, n)
        rng = seeded_stream(seed, "demo-device-chunk", index) if seed is not None else os_entropy_rng()
        yield _chunk(spec, population, start, stop, fleet, (key_id, analyzer), shuffler, backstop_key, rng,
                     seed is not None, threads)


def _chunk(spec: AnalysisSpec, population: Population, start: int, stop: int, fleet: SimulatedFleet,
           analyzer: tuple, shuffler: ShufflerKey, backstop_key: bytes, rng: np.random.Generator, seeded: bool,
           threads: int) -> list[bytes]:
    mechanism = spec.randomizer
    clients = [str(c) for c in population.client_ids[start:stop]]
    values = [event_value(spec, avro_value(spec, v)) for v in population.values[start:stop]]
    inputs = client_inputs(spec, values, rng)
    if is_memoizing(mechanism):
        messages = mechanism.fragments_from_backstop(
            prf_backstops(backstop_key, spec.metric, mechanism, clients, inputs), rng)
    else:
        messages = encode_messages(mechanism, inputs, rng)
    wire, owner = client_messages(mechanism, *messages, n_clients=len(clients))
    rows = array_to_rows(wire)
    bounds = np.searchsorted(owner, np.arange(len(clients) + 1), side="left")  # owner is sorted: rows per device
    fleet.prepare(clients, threads)
    times = population.event_times_ms[start:stop].tolist()
    crowds = (population.crowd_ids[start:stop] if population.crowd_ids is not None else [None] * len(clients))
    events = []
    for i, client in enumerate(clients):
        mine = rows[int(bounds[i]):int(bounds[i + 1])]
        events.append(EventRows(
            spec, mine, int(times[i]), crowds[i], fleet.device_id(client), fleet.signing_key(client),
            rng.bytes(16) if seeded else os.urandom(16),
            [rng.bytes(32) for _ in mine] if seeded else None,
            rng.bytes(32) if seeded else None))
    key_id, analyzer_public = analyzer
    return signed_message_sets(events, analyzer_public, key_id, shuffler, threads)

