"""Device-signed message sets: round trips, every tampered field refused, unknown devices, wire range checks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from trust_helpers import CROWD, SPEC, WINDOW_END, Trust

from schemas import SCHEMA_VERSION, WireFormatError, encode_record
from transforms.trust import (
    AuthError,
    MessageSet,
    SealedMessage,
    associated_data,
    decode_message_set,
    encode_message_set,
    open_sealed,
    sign_message_set,
    signing_bytes,
    verify_message_set,
)
from transforms.trust.message_set import MAX_MESSAGES, MAX_SEALED_BYTES


def test_round_trip_sign_encode_decode_verify_open(trust: Trust) -> None:
    ms = trust.message_set("alice", [(0, b"fragment-0"), (5, b"fragment-5"), (7, b"")])
    decoded = decode_message_set(encode_message_set(ms))
    assert decoded == ms
    verify_message_set(decoded, trust.registry)
    opened = [open_sealed(trust.analyzer_private, m.sealed, associated_data(SPEC, CROWD, WINDOW_END, m.channel))
              for m in decoded.messages]
    assert opened == [b"fragment-0", b"fragment-5", b""]
    no_crowd = trust.message_set("bob", [(0, b"x")], crowd=None)
    assert decode_message_set(encode_message_set(no_crowd)) == no_crowd
    verify_message_set(no_crowd, trust.registry)


def test_signing_bytes_cover_every_field_but_the_signature(trust: Trust) -> None:
    ms = trust.message_set("alice", [(0, b"a"), (1, b"b")])
    assert signing_bytes(ms) == signing_bytes(replace(ms, signature=b"\x00" * 64))
    assert b"esa-messageset-v1" in signing_bytes(ms)


TAMPERS = {
    "spec_id": lambda ms: replace(ms, spec_id=ms.spec_id + "x"),
    "crowd_id": lambda ms: replace(ms, crowd_id="v9"),
    "crowd_id-null": lambda ms: replace(ms, crowd_id=None),
    "crowd_id-empty": lambda ms: replace(ms, crowd_id=""),
    "event_time": lambda ms: replace(ms, event_time_ms=ms.event_time_ms + 1),
    "nonce": lambda ms: replace(ms, nonce=b"m" + ms.nonce[1:]),
    "key_id": lambda ms: replace(ms, key_id="20991231-00000000"),
    "channel": lambda ms: replace(ms, messages=(SealedMessage(9, ms.messages[0].sealed), *ms.messages[1:])),
    "sealed": lambda ms: replace(ms, messages=(SealedMessage(0, ms.messages[0].sealed[:-1] + b"\x00"),
                                               *ms.messages[1:])),
    "order": lambda ms: replace(ms, messages=ms.messages[::-1]),
    "dropped": lambda ms: replace(ms, messages=ms.messages[:1]),
    "added": lambda ms: replace(ms, messages=(*ms.messages, ms.messages[0])),
    "signature": lambda ms: replace(ms, signature=bytes([ms.signature[0] ^ 1]) + ms.signature[1:]),
    "signature-short": lambda ms: replace(ms, signature=ms.signature[:63]),
}


@pytest.mark.parametrize("field", list(TAMPERS))
def test_tampering_any_field_fails_verification(trust: Trust, field: str) -> None:
    ms = trust.message_set("alice", [(0, b"a"), (1, b"b")])
    verify_message_set(ms, trust.registry)
    with pytest.raises(AuthError, match=r"^bad signature"):
        verify_message_set(TAMPERS[field](ms), trust.registry)


def test_another_devices_key_or_id_fails_and_reasons_never_name_the_device(trust: Trust) -> None:
    alice = trust.message_set("alice", [(0, b"a")])
    as_bob = replace(alice, device_id=trust.fleet.device_id("bob"))
    signed_by_bob = sign_message_set(alice, trust.fleet.signing_key("bob"))
    stranger = trust.message_set("mallory", [(0, b"a")])
    reasons = []
    for ms in (as_bob, signed_by_bob, stranger):
        with pytest.raises(AuthError) as err:
            verify_message_set(ms, trust.registry)
        reasons.append(str(err.value))
    assert reasons == ["bad signature", "bad signature", "unknown device (not enrolled)"]
    for reason in reasons:
        for client in ("alice", "bob", "mallory"):
            assert client not in reason and trust.fleet.device_id(client) not in reason


def _record(ms: MessageSet, **changes: object) -> bytes:
    record = {"schema_version": SCHEMA_VERSION, "spec_id": ms.spec_id, "crowd_id": ms.crowd_id,
              "device_id": ms.device_id, "event_time": ms.event_time_ms, "nonce": ms.nonce, "key_id": ms.key_id,
              "messages": [{"channel": m.channel, "sealed": m.sealed} for m in ms.messages],
              "signature": ms.signature}
    record.update(changes)
    return encode_record("MessageSet", record)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"nonce": b"\x00" * 15}, "nonce must be 16 bytes"),
    ({"nonce": b"\x00" * 17}, "nonce must be 16 bytes"),
    ({"signature": b"\x00" * 63}, "signature must be 64 bytes"),
    ({"signature": b""}, "signature must be 64 bytes"),
    ({"device_id": "ABCDEF" + "0" * 26}, "device_id must be 32"),
    ({"device_id": "0" * 31}, "device_id must be 32"),
    ({"device_id": "0" * 32 + "\n"}, "device_id must be 32"),
    ({"messages": []}, "message count 0"),
    ({"messages": [{"channel": 0, "sealed": b"x"}] * (MAX_MESSAGES + 1)}, f"message count {MAX_MESSAGES + 1}"),
    ({"messages": [{"channel": 0, "sealed": b"x" * (MAX_SEALED_BYTES + 1)}]}, "sealed message must be"),
    ({"messages": [{"channel": -2, "sealed": b"x"}]}, "channel out of range"),
    ({"spec_id": ""}, "spec_id must be"),
    ({"spec_id": "s" * 201}, "spec_id must be"),
    ({"crowd_id": "c" * 201}, "crowd_id must be"),
    ({"key_id": "k" * 201}, "key_id must be"),
    ({"event_time": -1}, "event_time out of range"),
    ({"event_time": 2**53}, "event_time out of range"),
    ({"schema_version": 2}, "unknown MessageSet schema_version 2"),
])
def test_decode_range_checks(trust: Trust, changes: dict[str, object], reason: str) -> None:
    ms = trust.message_set("alice", [(0, b"a")])
    with pytest.raises(WireFormatError, match=reason):
        decode_message_set(_record(ms, **changes))


def test_decode_accepts_the_limits(trust: Trust) -> None:
    ms = trust.message_set("alice", [(0, b"a")])
    data = _record(ms, spec_id="s" * 200, crowd_id="", event_time=2**53 - 1,
                   messages=[{"channel": 2**31 - 1, "sealed": b"x" * MAX_SEALED_BYTES}] * 3)
    decoded = decode_message_set(data)
    assert len(decoded.messages) == 3 and decoded.crowd_id == ""


def test_encode_refuses_what_decode_would_refuse(trust: Trust) -> None:
    ms = trust.message_set("alice", [(0, b"a")])
    with pytest.raises(WireFormatError, match="signature must be 64"):
        encode_message_set(replace(ms, signature=b""))
    with pytest.raises(WireFormatError, match="message count 0"):
        encode_message_set(replace(ms, messages=()))


def test_decode_refuses_other_records_and_garbage(trust: Trust) -> None:
    with pytest.raises(WireFormatError):
        decode_message_set(b"\xc3\x01" + b"\x00" * 40)
    with pytest.raises(WireFormatError, match="not bytes"):
        decode_message_set(None)  # type: ignore[arg-type]
    data = encode_message_set(trust.message_set("alice", [(0, b"a")]))
    for cut in range(len(data)):
        with pytest.raises(WireFormatError):
            decode_message_set(data[:cut])
