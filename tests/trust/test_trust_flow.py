"""The three trust boundaries chained: devices -> shuffler -> analyzer, as the pipeline uses the library."""

from __future__ import annotations

import hashlib
import random

from trust_helpers import CROWD, SPEC, WINDOW_END, Trust

from transforms.trust import (
    ReleaseBatch,
    associated_data,
    decode_message_set,
    decode_release_batch,
    encode_message_set,
    encode_release_batch,
    open_sealed,
    release_id_of,
    sign_release_batch,
    split_into_batches,
    verify_message_set,
    verify_release_batch,
)


def test_sets_travel_blind_through_the_shuffler_and_open_only_at_the_analyzer(trust: Trust) -> None:
    clients = [f"client-{i}" for i in range(40)]
    trust.fleet.enroll(trust.registry, clients)
    payloads = {c: [(ch, f"{c}/{ch}".encode()) for ch in range(i % 3 + 1)] for i, c in enumerate(clients)}
    wire = [encode_message_set(trust.message_set(c, payloads[c], nonce=hashlib.sha256(c.encode()).digest()[:16]))
            for c in clients]

    # Shuffler: decode, authenticate, strip identity, permute, cut into signed batches.
    pool = []
    for data in wire:
        ms = decode_message_set(data)
        verify_message_set(ms, trust.registry)
        pool.extend(ms.messages)
    random.Random(7).shuffle(pool)  # a test: seeded on purpose
    parts = split_into_batches(pool, max_bytes=4096)
    assert len(parts) > 1
    release = [encode_release_batch(sign_release_batch(
        ReleaseBatch(release_id_of(SPEC, CROWD, WINDOW_END), SPEC, CROWD, WINDOW_END, i, len(parts),
                     len(clients), len(pool), 0, part), trust.shuffler_id, trust.shuffler_signer))
        for i, part in enumerate(parts)]

    # Analyzer: verify each batch, open each message under the routing fields the batch carries.
    opened = []
    for data in release:
        batch = decode_release_batch(data)
        verify_release_batch(batch, trust.shuffler_verifiers)
        for m in batch.messages:
            ad = associated_data(batch.spec_id, batch.crowd_id, batch.window_end_ms, m.channel)
            opened.append((m.channel, open_sealed(trust.analyzer_private, m.sealed, ad)))
    assert sorted(opened) == sorted(p for c in clients for p in payloads[c])
    # What the analyzer receives carries no device id, nonce or (sealed) plaintext anywhere.
    for c, data in zip(clients, wire, strict=True):
        ms = decode_message_set(data)
        leaks = (ms.device_id.encode(), bytes.fromhex(ms.device_id), ms.nonce, ms.signature, c.encode())
        assert all(leak not in r for leak in leaks for r in release), c
