"""``open_many`` (the analyzer's batch opening, X25519 on a thread pool) gives, blob by blob, exactly what
``open_sealed`` gives or raises, in input order, whatever the pool size."""

from __future__ import annotations

import os

import pytest
from trust_helpers import CROWD, SPEC, WINDOW_END, Trust

from transforms.trust import SealError, associated_data, open_sealed, seal
from transforms.trust.sealing import open_many


def _verdict(private, blob: bytes, ad: bytes) -> bytes | str:
    try:
        return open_sealed(private, blob, ad)
    except SealError as err:
        return f"SealError: {err}"


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_batch_opening_matches_one_by_one_on_good_and_hostile_blobs(trust: Trust, threads: int) -> None:
    ads = [associated_data(SPEC, CROWD, WINDOW_END, ch) for ch in range(3)]
    blobs, adds = [], []
    for i in range(120):
        ad = ads[i % 3]
        blob = seal(trust.analyzer_public, trust.analyzer_id, os.urandom(i % 40), ad)
        n = len(trust.analyzer_id)
        match i % 8:
            case 1:
                blob = blob[:-1] + bytes([blob[-1] ^ 1])  # tampered tag
            case 2:
                ad = ads[(i + 1) % 3]  # moved to another channel
            case 3:
                blob = blob[:2 + n] + bytes(32) + blob[2 + n + 32:]  # low-order ephemeral point
            case 4:
                blob = blob[:5]  # truncated
            case 5:
                blob = b"\x01\x03abc" + blob[2 + n:]  # a key id the analyzer does not have
        blobs.append(blob)
        adds.append(ad)
    adds[7] = "not bytes"  # type: ignore[call-overload]
    got = open_many(trust.analyzer_private, blobs, adds, threads)
    want = [_verdict(trust.analyzer_private, b, a) for b, a in zip(blobs, adds, strict=True)]
    assert [g if isinstance(g, bytes) else f"SealError: {g}" for g in got] == want
    assert all(isinstance(g, bytes | SealError) for g in got)
    assert sum(isinstance(g, bytes) for g in got) == 3 * 15 - 1  # cases 0, 6 and 7 open, but index 7


def test_lengths_must_match(trust: Trust) -> None:
    with pytest.raises(ValueError):
        open_many(trust.analyzer_private, [b"x", b"y"], [b"ad"], 1)
