"""The edge's pure rules: what a report body must be, what is forwarded, tokens, rate limits, the keys document."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.device.helpers import SHUFFLER, SHUFFLER_KEY_ID, client_kwargs, histogram_spec
from transforms.device import Client
from transforms.shuffler.edge_admission import (
    RateLimiter,
    keys_payload,
    keys_signing_bytes,
    mint_token,
    parse_enrolment,
    verify_token,
)
from transforms.shuffler.edge_rules import (
    RefusedError,
    admit_report,
    check_content_type,
    check_declared_length,
    forwarded_record,
    problem_body,
)
from transforms.trust.devices import device_id_of
from transforms.trust.envelope import seal_envelope

KEYS = {SHUFFLER_KEY_ID: SHUFFLER}
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    return Client(histogram_spec("grr", 1.0, d=8), tmp_path_factory.mktemp("device"), rng=np.random.default_rng(1),
                  **client_kwargs())


def _status(call, *args) -> int:
    with pytest.raises(RefusedError) as refused:
        call(*args)
    return refused.value.status


def test_a_client_report_is_admitted_with_its_device_id(client: Client) -> None:
    assert admit_report(client.encode(3), KEYS, LIMIT) == client.device_id


def test_malformed_bodies_are_400_and_oversized_413(client: Client) -> None:
    body = client.encode(2)
    tampered = body[:-1] + bytes([body[-1] ^ 1])
    other_key = {"20260101-00000000": SHUFFLER}
    assert _status(admit_report, b"", KEYS, LIMIT) == 400
    assert _status(admit_report, b"\x01garbage" * 10, KEYS, LIMIT) == 400
    assert _status(admit_report, tampered, KEYS, LIMIT) == 400
    assert _status(admit_report, body, other_key, LIMIT) == 400  # sealed to a key this edge does not hold
    assert _status(admit_report, seal_envelope(SHUFFLER.public_key(), SHUFFLER_KEY_ID, b"not a set"), KEYS,
                   LIMIT) == 400
    assert _status(admit_report, body, KEYS, len(body) - 1) == 413
    assert _status(check_declared_length, LIMIT + 1, LIMIT) == 413
    check_declared_length(None, LIMIT)  # chunked: judged once read


def test_content_types() -> None:
    check_content_type("application/octet-stream")
    check_content_type("Application/Octet-Stream; charset=binary")
    for bad in (None, "", "text/plain", "application/json"):
        assert _status(check_content_type, bad) == 415


def test_problem_details_name_the_problem_not_the_sender() -> None:
    doc = json.loads(problem_body(RefusedError(429, "rate-limited", "Too many reports", "slow down", 7)))
    assert doc == {"type": "urn:esa:problem:rate-limited", "title": "Too many reports", "status": 429,
                   "detail": "slow down"}


def test_the_forwarded_record_is_the_body_with_no_key_and_a_minute_timestamp() -> None:
    record = forwarded_record(b"body", 1_764_000_123_456)
    assert record.key is None and record.value == b"body"
    assert record.timestamp_ms == 1_764_000_120_000


def test_tokens_bind_one_key_and_expire() -> None:
    secret, key, other = bytes(range(32)), bytes(32), bytes([1] * 32)
    token = mint_token(secret, key, 1000)
    verify_token(secret, key, token, 999.0)
    for args in ((secret, key, token, 1000.0), (secret, other, token, 10.0), (bytes(32), key, token, 10.0),
                 (secret, key, token.replace("v1.1000", "v1.9999"), 10.0), (secret, key, None, 10.0),
                 (secret, key, "v1.x.y", 10.0)):
        assert _status(verify_token, *args) == 403


def test_enrolment_bodies() -> None:
    key = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    assert parse_enrolment(json.dumps({"public_key": key.hex()}).encode(), False) == (key, None)
    assert parse_enrolment(json.dumps({"public_key": key.hex(), "token": "t"}).encode(), True) == (key, "t")
    assert _status(parse_enrolment, json.dumps({"public_key": key.hex()}).encode(), True) == 403
    for bad in (b"{", b"[]", b'{"public_key": "abc"}', json.dumps({"public_key": key.hex().upper()}).encode(),
                b"x" * 5000):
        assert _status(parse_enrolment, bad, False) in (400, 413)
    assert device_id_of(key)  # the id the edge answers with


def test_rate_limiter_bursts_then_refills_per_device() -> None:
    limiter = RateLimiter(rate=2.0, burst=3)
    assert [limiter.wait("a", 0.0) for _ in range(4)] == [0, 0, 0, 1]
    assert limiter.wait("b", 0.0) == 0  # another device is not affected
    assert limiter.wait("a", 0.5) == 0  # one token back after half a second at 2/s
    assert limiter.wait("a", 0.5) == 1
    assert RateLimiter(rate=0.0, burst=1).wait("a", 0.0) == 0  # off


def test_rate_limiter_memory_is_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, max_devices=100)
    for i in range(1000):
        limiter.wait(str(i), 0.0)
    assert len(limiter) == 100


def test_keys_document_signature_verifies() -> None:
    signer = Ed25519PrivateKey.generate()
    payload = keys_payload(("a-id", bytes(32)), ("s-id", bytes([2] * 32)))
    doc = json.loads(payload)
    assert doc["analyzer"] == {"key_id": "a-id", "public_key": "00" * 32} and doc["shuffler"]["key_id"] == "s-id"
    signer.public_key().verify(signer.sign(keys_signing_bytes(payload)), keys_signing_bytes(payload))
