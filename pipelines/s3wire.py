"""Byte-level pieces of the S3 wire protocol that `pipelines.s3server` parses: ranges and aws-chunked bodies."""

from __future__ import annotations

__all__ = ["decode_aws_chunked", "parse_range"]


def decode_aws_chunked(body: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body: ``<hex size>[;chunk-signature=..]\r\n<data>\r\n`` chunks up to
    a zero-size one, then optional trailer headers (checksums), which are dropped."""
    out, i = bytearray(), 0
    while True:
        eol = body.find(b"\r\n", i)
        if eol < 0:
            raise ValueError("truncated aws-chunked body")
        size = int(body[i:eol].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        start = eol + 2
        if len(body) < start + size + 2 or body[start + size: start + size + 2] != b"\r\n":
            raise ValueError("malformed aws-chunked body")
        out += body[start: start + size]
        i = start + size + 2


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """Inclusive byte range of a single-range `Range` header, or None when it cannot be satisfied."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    if not first:
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    return (start, end) if start <= end and start < size else None
