"""What goes on the wire from a device: one event's messages, each sealed to the analyzer, in a signed set.

Shared by the device client and the edge encoder (``transforms.seal``), so both send byte-for-byte the
same format: every message's payload is padded (``records.encode_payload``) and sealed on its own with a
fresh ephemeral key (so two messages of one device cannot be linked), with the routing fields that
survive the shuffle (spec, crowd, window end, channel) as associated data; the set is signed with the
device's Ed25519 key.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from transforms.records import PayloadRow, encode_payload, row_channel
from transforms.spec import AnalysisSpec
from transforms.trust.ed25519 import Signer
from transforms.trust.message_set import MessageSet, SealedMessage, encode_message_set, sign_message_set
from transforms.trust.sealing import associated_data, seal


def window_end_ms(spec: AnalysisSpec, event_time_ms: int) -> int:
    window = spec.window_seconds * 1000
    return (event_time_ms // window + 1) * window


def signed_message_set(spec: AnalysisSpec, rows: Sequence[PayloadRow], *, event_time_ms: int, crowd_id: str | None,
                       device_id: str, signer: Signer, analyzer: X25519PublicKey, key_id: str,
                       nonce: bytes, ephemerals: Sequence[bytes | None] | None = None) -> bytes:
    """The encoded, signed MessageSet of one event's payload rows.

    ``ephemerals`` (one per row) make the sealing reproducible (a retried encoder resends the same bytes);
    None draws fresh ephemeral keys from OS entropy.
    """
    mechanism = spec.randomizer
    end = window_end_ms(spec, event_time_ms)
    messages = []
    for i, row in enumerate(rows):
        channel = row_channel(mechanism, row)
        sealed = seal(analyzer, key_id, encode_payload(mechanism, row),
                      associated_data(spec.spec_id, crowd_id, end, channel), ephemerals[i] if ephemerals else None)
        messages.append(SealedMessage(channel, sealed))
    unsigned = MessageSet(spec_id=spec.spec_id, crowd_id=crowd_id, device_id=device_id, event_time_ms=event_time_ms,
                          nonce=nonce, key_id=key_id, messages=tuple(messages))
    return encode_message_set(sign_message_set(unsigned, signer))
