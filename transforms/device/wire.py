"""What goes on the wire from a device: one event's messages, each sealed to the analyzer, in a signed set.

Shared by the device client and the edge encoder (``transforms.encoder.seal``), so both send byte-for-byte the
same format: every message's payload is padded (``records.encode_payload``) and sealed on its own with a
fresh ephemeral key (so two messages of one device cannot be linked), with the routing fields that
survive the shuffle (spec, crowd, window end, channel) as associated data; the set is signed with the
device's Ed25519 key; the encoded set is then sealed whole to the shuffler (``trust.envelope``: nested
encryption, so the reports topic never holds the blobs the shuffler releases).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from transforms.mechanisms.base import Mechanism
from transforms.spec import AnalysisSpec
from transforms.trust.ed25519 import Signer, sign_many
from transforms.trust.envelope import seal_envelopes
from transforms.trust.message_set import MessageSet, SealedMessage, encode_message_set, signing_bytes
from transforms.trust.sealing import associated_data, seal_many
from transforms.wire.avro_payload import encode_payload
from transforms.wire.payload_codec import encode_payloads
from transforms.wire.rows import CHANNEL, PayloadRow, array_to_rows, rows_to_array, wire_dtype


def window_end_ms(spec: AnalysisSpec, event_time_ms: int) -> int:
    window = spec.window_seconds * 1000
    return (event_time_ms // window + 1) * window


class EventRows(NamedTuple):
    """One event's payload rows and what its set carries besides them (``signed_message_sets``). ``rows``: wire
    tuples (a device), or the event's slice of the mechanism's wire array (the edge encoder, which keeps its
    batch in arrays from the randomizer to the payload codec)."""

    spec: AnalysisSpec
    rows: Sequence[PayloadRow] | np.ndarray
    event_time_ms: int
    crowd_id: str | None
    device_id: str
    signer: Signer
    nonce: bytes
    ephemerals: Sequence[bytes] | None = None  # one per row: reproducible sealing; None: OS entropy
    envelope_ephemeral: bytes | None = None  # the outer layer's (to the shuffler); None: OS entropy


class ShufflerKey(NamedTuple):
    """The shuffler's sealing public key and its id: the outer layer of every set."""

    key_id: str
    public: X25519PublicKey


def signed_message_set(spec: AnalysisSpec, rows: Sequence[PayloadRow], *, event_time_ms: int, crowd_id: str | None,
                       device_id: str, signer: Signer, analyzer: X25519PublicKey, key_id: str,
                       shuffler: ShufflerKey, nonce: bytes, ephemerals: Sequence[bytes | None] | None = None,
                       envelope_ephemeral: bytes | None = None) -> bytes:
    """The signed MessageSet of one event's payload rows, sealed whole to the shuffler.

    ``ephemerals`` (one per row) and ``envelope_ephemeral`` make the sealing reproducible (a retried encoder
    resends the same bytes); None draws fresh ephemeral keys from OS entropy.
    """
    fixed = None if ephemerals is None else [e if e is not None else os.urandom(32) for e in ephemerals]
    event = EventRows(spec, rows, event_time_ms, crowd_id, device_id, signer, nonce, fixed, envelope_ephemeral)
    return signed_message_sets([event], analyzer, key_id, shuffler)[0]


_VECTOR_MIN = 16  # rows of one mechanism from which one vectorized call beats per-row fastavro (~6 us a row)


def _plaintexts(events: Sequence[EventRows], stacked: np.ndarray | None = None) -> list[bytes]:
    """Every row's padded payload plaintext, in order: rows of one mechanism in one ``encode_payloads`` call.

    ``stacked``: every event's rows in order, already one wire array (the edge encoder's batch, all of one
    mechanism), encoded as it is. Otherwise rows given as wire arrays are concatenated; wire tuples
    (``records.array_to_rows``) are stacked into the wire dtype first, and rows that do not stack are encoded (or
    refused) one by one by ``encode_payload``, as before."""
    if stacked is not None and events:
        matrix = encode_payloads(events[0].spec.randomizer, stacked)
        blob, width = matrix.tobytes(), matrix.shape[1]
        return [blob[k * width:(k + 1) * width] for k in range(len(stacked))]
    groups: dict[int, tuple[Mechanism, list[Sequence[PayloadRow] | np.ndarray], list[int]]] = {}
    position = 0
    for event in events:
        mechanism = event.spec.randomizer
        _, chunks, where = groups.setdefault(id(mechanism), (mechanism, [], []))
        chunks.append(event.rows)
        where.extend(range(position, position + len(event.rows)))
        position += len(event.rows)
    out: list[bytes] = [b""] * position
    for mechanism, chunks, where in groups.values():
        encoded = None
        arrays = all(isinstance(c, np.ndarray) for c in chunks)
        if arrays or len(where) >= _VECTOR_MIN:
            with contextlib.suppress(ValueError, OverflowError, TypeError):  # rows that do not stack: per row
                stacked = (np.concatenate(chunks) if arrays
                           else rows_to_array(mechanism, [row for chunk in chunks for row in chunk]))
                matrix = encode_payloads(mechanism, stacked)
                blob, width = matrix.tobytes(), matrix.shape[1]
                encoded = [blob[k * width:(k + 1) * width] for k in range(len(where))]
        if encoded is None:
            encoded = [encode_payload(mechanism, row) for chunk in chunks
                       for row in (array_to_rows(chunk) if isinstance(chunk, np.ndarray) else chunk)]
        for k, data in zip(where, encoded, strict=True):
            out[k] = data
    return out


def signed_message_sets(events: Sequence[EventRows], analyzer: X25519PublicKey, key_id: str, shuffler: ShufflerKey,
                        threads: int = 1, stacked: np.ndarray | None = None) -> list[bytes]:
    """``signed_message_set`` of each event (sealed to the shuffler), the same bytes; the native calls of the
    whole batch (X25519 pairs, signatures) on ``threads`` (``transforms.runtime.parallel``), the rest on this thread.
    ``stacked``: the events' rows as one wire array, when the caller has it (``_plaintexts``)."""
    plaintexts, ads, ephemerals, channels = _plaintexts(events, stacked), [], [], []
    routing: dict[tuple, bytes] = {}  # associated data by (spec, crowd, window end, channel): few per batch
    for event in events:
        mechanism = event.spec.randomizer
        end = window_end_ms(event.spec, event.event_time_ms)
        for i, channel in enumerate(_channels(mechanism, event.rows)):
            key = (event.spec.spec_id, event.crowd_id, end, channel)
            ad = routing.get(key)
            if ad is None:
                ad = routing[key] = associated_data(*key)
            ads.append(ad)
            ephemerals.append(event.ephemerals[i] if event.ephemerals is not None else os.urandom(32))
            channels.append(channel)
    sealed = iter(zip(channels, seal_many(analyzer, key_id, plaintexts, ads, ephemerals, threads), strict=True))
    unsigned = [MessageSet(spec_id=e.spec.spec_id, crowd_id=e.crowd_id, device_id=e.device_id,
                           event_time_ms=e.event_time_ms, nonce=e.nonce, key_id=key_id,
                           messages=tuple(SealedMessage(*next(sealed)) for _ in e.rows))
                for e in events]
    signatures = sign_many([e.signer for e in events], [signing_bytes(ms) for ms in unsigned], threads)
    encoded = [encode_message_set(MessageSet(ms.spec_id, ms.crowd_id, ms.device_id, ms.event_time_ms, ms.nonce,
                                             ms.key_id, ms.messages, signature))
               for ms, signature in zip(unsigned, signatures, strict=True)]
    outer = [e.envelope_ephemeral if e.envelope_ephemeral is not None else os.urandom(32) for e in events]
    return seal_envelopes(shuffler.public, shuffler.key_id, encoded, outer, threads)


def _channels(mechanism: Mechanism, rows: Sequence[PayloadRow] | np.ndarray) -> list[int]:
    """The channel each wire row travels on (``records.row_channel``): 0 for single-message mechanisms."""
    names = wire_dtype(mechanism).names
    if CHANNEL not in names:
        return [0] * len(rows)
    if isinstance(rows, np.ndarray):
        return rows[CHANNEL].tolist()
    at = names.index(CHANNEL)
    return [int(row[at]) for row in rows]
