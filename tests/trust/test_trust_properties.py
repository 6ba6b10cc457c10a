"""Properties (hypothesis): arbitrary bytes never escape the documented error types.

A shuffler and an analyzer read bytes from the network: any input must end as a clean refusal
(WireFormatError, SealError, AuthError) that becomes a dead letter, never as a crash of the job.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trust_helpers import CROWD, SPEC, WINDOW_END, make_trust

from schemas import WireFormatError, load_schema
from transforms.trust import (
    AuthError,
    MessageSet,
    ReleaseBatch,
    SealedMessage,
    SealError,
    associated_data,
    decode_message_set,
    decode_release_batch,
    encode_message_set,
    encode_release_batch,
    open_sealed,
    release_id_of,
    seal,
    sign_release_batch,
    verify_message_set,
    verify_release_batch,
)

_KEYS = tempfile.TemporaryDirectory(prefix="esa-trust-props-")  # removed at interpreter exit
TRUST = make_trust(Path(_KEYS.name) / "keys")
AD = associated_data(SPEC, CROWD, WINDOW_END, 0)
SET_BYTES = encode_message_set(TRUST.message_set("alice", [(0, b"a"), (3, b"bc")]))
SIGNED_BATCH = sign_release_batch(
    ReleaseBatch(release_id_of(SPEC, CROWD, WINDOW_END), SPEC, CROWD, WINDOW_END, 0, 1, 2, 2, None,
                 (SealedMessage(0, b"\x01a"), SealedMessage(1, b"\x01b"))), TRUST.shuffler_id, TRUST.shuffler_signer)
BATCH_BYTES = encode_release_batch(SIGNED_BATCH)
SEALED = seal(TRUST.analyzer_public, TRUST.analyzer_id, b"payload", AD)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """Valid encodings with bytes flipped, cut or appended: reach deep into the decoder, not just the header."""
    flips = st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(1, 255)), max_size=4)

    def apply(edits: list[tuple[int, int]], cut: int | None, tail: bytes) -> bytes:
        data = bytearray(valid)
        for i, x in edits:
            data[i] ^= x
        return bytes(data[:cut]) + tail
    cuts = st.one_of(st.none(), st.integers(0, len(valid)))
    tails = st.one_of(st.just(b""), st.binary(min_size=1, max_size=8))
    return st.builds(apply, flips, cuts, tails)


def behind_header(name: str) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=200).map(lambda b: load_schema(name).header + b)


@SETTINGS
@given(st.one_of(st.binary(max_size=300), behind_header("MessageSet"), mutated(SET_BYTES)))
def test_decode_message_set_raises_only_wire_format_errors(data: bytes) -> None:
    try:
        ms = decode_message_set(data)
    except WireFormatError:
        return
    try:  # whatever decodes must be refused as an AuthError, unless it is the genuine set
        verify_message_set(ms, TRUST.registry)
    except AuthError:
        return
    assert ms == decode_message_set(SET_BYTES)


@SETTINGS
@given(st.one_of(st.binary(max_size=300), behind_header("ReleaseBatch"), mutated(BATCH_BYTES)))
def test_decode_release_batch_raises_only_wire_format_errors(data: bytes) -> None:
    try:
        batch = decode_release_batch(data)
    except WireFormatError:
        return
    try:
        verify_release_batch(batch, TRUST.shuffler_verifiers)
    except AuthError:
        return
    assert batch == SIGNED_BATCH


@SETTINGS
@given(st.one_of(st.binary(max_size=120), mutated(SEALED)), st.binary(max_size=40))
def test_open_sealed_raises_only_seal_errors(blob: bytes, associated: bytes) -> None:
    try:
        assert open_sealed(TRUST.analyzer_private, blob, associated) == b"payload"
    except SealError:
        return
    assert blob == SEALED and associated == AD  # only the genuine blob with its routing fields opens


ids = st.one_of(st.none(), st.text(max_size=40), st.sampled_from([TRUST.fleet.device_id("alice"), "0" * 32]))
messages = st.lists(st.builds(SealedMessage, st.integers(-(2**70), 2**70), st.binary(max_size=20)), max_size=4)


@SETTINGS
@given(st.builds(MessageSet, st.text(max_size=20), st.one_of(st.none(), st.text(max_size=10)), ids,
                 st.integers(-(2**70), 2**70), st.binary(max_size=20), st.text(max_size=20),
                 messages.map(tuple), st.binary(max_size=70)))
def test_verify_message_set_raises_only_auth_errors(ms: MessageSet) -> None:
    try:
        verify_message_set(ms, TRUST.registry)
    except AuthError as err:
        assert TRUST.fleet.device_id("alice") not in str(err)
    else:
        raise AssertionError("an arbitrary message set verified")


@SETTINGS
@given(st.builds(ReleaseBatch, st.text(max_size=40), st.text(max_size=20), st.one_of(st.none(), st.text(max_size=9)),
                 st.integers(-(2**70), 2**70), st.integers(-5, 5), st.integers(-5, 5), st.integers(-(2**70), 2**70),
                 st.integers(-(2**70), 2**70), st.one_of(st.none(), st.integers(-(2**70), 2**70)),
                 messages.map(tuple), st.sampled_from([TRUST.shuffler_id, "", "x"]), st.binary(max_size=70)))
def test_verify_release_batch_raises_only_auth_errors(batch: ReleaseBatch) -> None:
    try:
        verify_release_batch(batch, TRUST.shuffler_verifiers)
    except AuthError:
        return
    raise AssertionError("an arbitrary release batch verified")
