"""What the batch payload decoders are held to: ``records.decode_payload`` on each plaintext alone."""

from __future__ import annotations

from typing import Any

from transforms.wire.avro_payload import decode_payload


def one_by_one(mechanism: Any, plaintexts: list[bytes], channels: list[int]) -> list[Any]:
    """Per plaintext: its decoded row, or the reason it was refused."""
    out: list[Any] = []
    for data, channel in zip(plaintexts, channels, strict=True):
        try:
            out.append(decode_payload(mechanism, data, channel))
        except ValueError as err:
            out.append(str(err))
    return out
