"""Signed release batches encoded from arrays: the shuffler's release step without an object per message.

Why: ``encode_release_batch(sign_release_batch(batch))`` takes a batch of ``SealedMessage``\\ s, and the
shuffler's driver then spent about 5 microseconds per released message in Python (a dataclass per message,
its range check, its signed encoding, a dict for fastavro and fastavro's writer): more than a tenth of the
shuffle job's CPU beyond its cryptography. Here a batch's messages stay a channel array, an offset array and
one payload buffer (``transforms.shuffler.packed.PackedMessages``' storage), and both encodings of the
messages -- the canonical one whose digest is signed (``message_set.messages_bytes``) and Avro's array of
``SealedMessage`` records -- are built with numpy. Everything else of the batch (ids, counts, key id,
signature) is still written by fastavro, and the message array is spliced into its place.

The bytes are exactly those of ``encode_release_batch(sign_release_batch(...))`` for the same messages
(Ed25519 signatures are deterministic); ``tests/trust/test_release_packed.py`` compares the two.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from schemas import WireFormatError

from .message_set import MAX_CHANNEL, MAX_SEALED_BYTES, MIN_CHANNEL
from .release import ReleaseBatch, _check, encode_release_batch, signing_bytes_of

__all__ = ["avro_messages", "canonical_messages", "check_packed", "signed_batch_bytes"]

_I64 = struct.Struct(">q")
_ENTRY = np.dtype([("channel", ">i8"), ("length", ">u4")])  # messages_bytes: channel and length of each message
_VARINT_MAX = 10  # bytes of a 64-bit zig-zag varint at most


def check_packed(channels: np.ndarray, offsets: np.ndarray) -> None:
    """``message_set.check_messages`` (no count limit) on arrays: the same reasons, for the first bad message."""
    lengths = np.diff(offsets)
    bad_channel = (channels < MIN_CHANNEL) | (channels > MAX_CHANNEL)
    bad_length = (lengths < 1) | (lengths > MAX_SEALED_BYTES)
    bad = np.flatnonzero(bad_channel | bad_length)
    if len(bad):
        if bad_channel[bad[0]]:
            raise WireFormatError("channel out of range [-1, 2^31)")
        raise WireFormatError(f"sealed message must be 1..{MAX_SEALED_BYTES} bytes")


def canonical_messages(channels: np.ndarray, offsets: np.ndarray, payload: bytes) -> bytes:
    """``message_set.messages_bytes`` of these messages: count, then each (channel, length, payload), big-endian."""
    n = len(channels)
    entries = np.empty(n, _ENTRY)
    entries["channel"], entries["length"] = channels, np.diff(offsets)
    return _I64.pack(n) + _interleave(entries.view(np.uint8).reshape(n, _ENTRY.itemsize), offsets, payload)


def avro_messages(channels: np.ndarray, offsets: np.ndarray, payload: bytes) -> bytes:
    """The Avro encoding of ``messages`` (an array of records {channel: int, sealed: bytes}) as fastavro writes
    it: one block (count, the records, a 0), or a lone 0 for no message."""
    n = len(channels)
    if not n:
        return b"\x00"
    channel_bytes, channel_sizes = _varints(channels)
    length_bytes, length_sizes = _varints(np.diff(offsets))
    width = int(channel_sizes.max()) + int(length_sizes.max())
    heads = np.zeros((n, width), np.uint8)
    if np.all(channel_sizes == channel_sizes[0]) and np.all(length_sizes == length_sizes[0]):
        c = int(channel_sizes[0])
        heads[:, :c], heads[:, c:] = channel_bytes[:, :c], length_bytes[:, :width - c]
        body = _interleave(heads, offsets, payload)
    else:  # varints of different lengths: each message's head is its own length (rare: channels past 63)
        columns = np.arange(width)  # at most 5 + 2 bytes: an int channel, a length up to MAX_SEALED_BYTES
        in_channel = columns < channel_sizes[:, None]
        shifted = np.take_along_axis(length_bytes, np.clip(columns - channel_sizes[:, None], 0, _VARINT_MAX - 1),
                                     axis=1)
        heads = np.where(in_channel, channel_bytes[:, :width], shifted).astype(np.uint8)
        body = _interleave(heads, offsets, payload, channel_sizes + length_sizes)
    count, _ = _varints(np.asarray([n]))
    return count[0, :_varint_size(n)].tobytes() + body + b"\x00"


def signed_batch_bytes(batch: ReleaseBatch, channels: np.ndarray, offsets: np.ndarray, payload: bytes, key_id: str,
                       signer: Ed25519PrivateKey) -> bytes:
    """``encode_release_batch(sign_release_batch(batch with these messages, key_id, signer))``; ``batch`` is
    given without messages (its ``messages`` are ignored)."""
    channels, offsets = np.asarray(channels, np.int64), np.asarray(offsets, np.int64)
    if offsets.shape != (len(channels) + 1,) or offsets[0] != 0 or offsets[-1] != len(payload):
        raise ValueError("need n channels and n + 1 offsets rising from 0 to the payload length")
    header = ReleaseBatch(batch.release_id, batch.spec_id, batch.crowd_id, batch.window_end_ms, batch.batch_index,
                          batch.batch_count, batch.n_sets, batch.n_messages, batch.deleted, (), key_id)
    digest = hashlib.sha256(canonical_messages(channels, offsets, payload)).digest()
    signature = signer.sign(signing_bytes_of(header, len(channels), digest))
    signed = replace(header, signature=signature)
    _check(signed)  # every field but the messages, as encode_release_batch checks them
    if signed.n_messages < len(channels):
        raise WireFormatError(f"batch holds {len(channels)} messages, release declares {signed.n_messages}")
    check_packed(channels, offsets)
    empty = encode_release_batch(signed)
    # The fields after the messages: key_id (string) and signature (bytes), each a varint length and its bytes.
    key = key_id.encode("utf-8")
    tail = _varint_size(len(key)) + len(key) + _varint_size(len(signature)) + len(signature)
    at = len(empty) - tail - 1
    if empty[at] != 0:  # the empty array's lone 0: where the messages go
        raise AssertionError("the ReleaseBatch layout is not the one this encoder splices into")
    return empty[:at] + avro_messages(channels, offsets, payload) + empty[at + 1:]


def _varint_size(value: int) -> int:
    zz = (value << 1) ^ (value >> 63)
    return max(1, -(-zz.bit_length() // 7))


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Avro's zig-zag varint of each value: (n x 10 bytes, padded with zeros; each one's length)."""
    v = np.asarray(values, np.int64)
    zz = ((v << 1) ^ (v >> 63)).view(np.uint64)
    groups = np.stack([(zz >> np.uint64(7 * k)) & np.uint64(0x7F) for k in range(_VARINT_MAX)], axis=1)
    sizes = 1 + sum((zz >= np.uint64(1 << (7 * k))).astype(np.int64) for k in range(1, _VARINT_MAX))
    more = np.arange(_VARINT_MAX) < (sizes[:, None] - 1)  # a continuation bit on every byte but the last
    return (groups | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8), sizes


def _interleave(heads: np.ndarray, offsets: np.ndarray, payload: bytes, sizes: np.ndarray | None = None) -> bytes:
    """Each message's head (a row of ``heads``; only its first ``sizes[i]`` bytes if given) then its payload."""
    n, width = heads.shape
    lengths = np.diff(offsets)
    data = np.frombuffer(payload, np.uint8)
    if sizes is None and n and np.all(lengths == lengths[0]):
        out = np.empty((n, width + int(lengths[0])), np.uint8)
        out[:, :width], out[:, width:] = heads, data.reshape(n, -1)
        return out.tobytes()
    sizes = np.full(n, width, np.int64) if sizes is None else np.asarray(sizes, np.int64)
    record = sizes + lengths
    starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(record)[:-1]])
    out = np.empty(int(record.sum()), np.uint8)
    used = np.arange(width) < sizes[:, None]
    out[(starts[:, None] + np.arange(width))[used]] = heads[used]
    at = np.repeat(starts + sizes - offsets[:-1], lengths) + np.arange(len(data))
    out[at] = data
    return out.tobytes()
