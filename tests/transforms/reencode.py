"""Non-canonical Avro re-encodings of a ``MessageSet``: the same fields (and so the same valid signature) in
other bytes, as an attacker holding a set's plaintext can write them and fastavro still reads them.

Three freedoms of the Avro binary encoding: every int/long (lengths, counts, the union branch, the event time,
channels) may be written as an overlong varint (zero 7-bit groups after the value); an array may be split into
several blocks, each optionally with a negative count followed by its size in bytes; and a long may be written
64 bits wider (the decoders keep its low 64 bits).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from schemas import SCHEMA_VERSION, load_schema
from transforms.trust.message_set import MessageSet

_HEADER = load_schema("MessageSet").header


def varint(n: int, pad: int = 0) -> bytes:
    """Zig-zag varint of ``n`` followed by ``pad`` redundant zero groups (``pad`` = 0: the canonical bytes)."""
    z = (n << 1) if n >= 0 else ((-n) << 1) - 1
    out = bytearray()
    while True:
        low, z = z & 0x7F, z >> 7
        if z == 0 and pad == 0:
            out.append(low)
            return bytes(out)
        if z == 0:
            out.append(low | 0x80)
            out += b"\x80" * (pad - 1) + b"\x00"
            return bytes(out)
        out.append(low | 0x80)


@dataclass(frozen=True)
class Layout:
    """One re-encoding: padding per varint (cycled), array blocks, and whether the time is written 2^64 wider."""

    pads: tuple[int, ...]
    blocks: tuple[int, ...]  # sizes of the leading blocks of the message array (the rest in one block)
    sized_blocks: bool  # blocks written as (-count, byte size, items)
    wide_time: bool

    def write(self, ms: MessageSet) -> bytes:
        pads = iter(self.pads * 64)

        def v(n: int) -> bytes:
            return varint(n, next(pads, 0))

        def blob(data: bytes) -> bytes:
            return v(len(data)) + data

        out = [_HEADER, v(SCHEMA_VERSION), blob(ms.spec_id.encode())]
        out.append(v(0) if ms.crowd_id is None else v(1) + blob(ms.crowd_id.encode()))
        time = ms.event_time_ms + (1 << 64) if self.wide_time else ms.event_time_ms
        out += [blob(ms.device_id.encode()), v(time), blob(ms.nonce), blob(ms.key_id.encode())]
        items = [v(m.channel) + blob(m.sealed) for m in ms.messages]
        start = 0
        for size in [*self.blocks, len(items)]:
            chunk = items[start:start + size]
            if not chunk:
                continue
            body = b"".join(chunk)
            out.append(v(-len(chunk)) + v(len(body)) + body if self.sized_blocks else v(len(chunk)) + body)
            start += len(chunk)
        out += [v(0), blob(ms.signature)]
        return b"".join(out)


layouts = st.builds(Layout, pads=st.lists(st.integers(0, 3), min_size=1, max_size=12).map(tuple),
                    blocks=st.lists(st.integers(1, 3), max_size=3).map(tuple), sized_blocks=st.booleans(),
                    wide_time=st.booleans())
