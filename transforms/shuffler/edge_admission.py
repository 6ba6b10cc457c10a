"""The ingestion edge's admission rules: enrolment tokens, per-device rate limits, the signed keys document.

Pure (no I/O, no clock of its own: every function is given ``now``), so each rule is tested on its own:

* **enrolment tokens** -- under ``--enrolment token`` a device enrols only with a token the operator's app
  backend minted (``esa edge-token``): ``v1.<expiry>.<hex HMAC-SHA256>`` over the device's public key and the
  expiry, under a 32-byte secret in the keys directory. A token binds one key, so a leaked token enrols nothing
  else, and expires, so an old one cannot be replayed for ever;
* **rate limits** -- a token bucket per claimed device id, in memory only and bounded (least recently seen
  buckets are forgotten first), so a device flooding the edge gets 429 while the others are served;
* **the keys document** -- ``GET /v1/keys``: the analyzer's and the shuffler's current public keys with their ids,
  signed by the shuffler's Ed25519 key, so a device follows key rotation without trusting the transport.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections import OrderedDict
from dataclasses import dataclass

from transforms.trust.canonical import KEYS_DOCUMENT_TAG as KEYS_SIGNATURE_TAG

from .edge_rules import RefusedError

__all__ = ["KEYS_SIGNATURE_TAG", "RateLimiter", "keys_payload", "keys_signing_bytes", "mint_token",
           "parse_enrolment", "verify_token"]

TOKEN_VERSION = "v1"
TOKEN_TAG = b"esa-enrol-token-v1|"
PUBLIC_KEY_HEX = 64
MAX_ENROL_BYTES = 4096


def _token_mac(secret: bytes, public_key: bytes, expires_at: int) -> str:
    message = TOKEN_TAG + bytes(public_key) + b"|" + str(expires_at).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def mint_token(secret: bytes, public_key: bytes, expires_at: int) -> str:
    """The enrolment token admitting ``public_key`` until ``expires_at`` (Unix seconds)."""
    if len(secret) < 16:
        raise ValueError("the enrolment secret must be at least 16 bytes")
    if len(public_key) != 32:
        raise ValueError("a public key is 32 raw bytes")
    if not isinstance(expires_at, int) or expires_at < 0:
        raise ValueError("expires_at must be a non-negative integer (Unix seconds)")
    return f"{TOKEN_VERSION}.{expires_at}.{_token_mac(secret, public_key, expires_at)}"


def verify_token(secret: bytes, public_key: bytes, token: object, now: float) -> None:
    """Nothing if ``token`` admits ``public_key`` at ``now``; ``RefusedError`` 403 otherwise (one reason for every
    forgery, so the answer teaches nothing about the secret)."""
    refused = RefusedError(403, "enrolment-refused", "Enrolment refused",
                           "the enrolment token is invalid or has expired")
    if not isinstance(token, str) or len(token) > 200:
        raise refused
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_VERSION or not parts[1].isdigit():
        raise refused
    expires_at = int(parts[1])
    if not hmac.compare_digest(parts[2], _token_mac(secret, public_key, expires_at)) or now >= expires_at:
        raise refused


def parse_enrolment(body: bytes, need_token: bool) -> tuple[bytes, str | None]:
    """(raw public key, token) of a ``POST /v1/enrol`` body ``{"public_key": "<64 hex>", "token": "..."}``;
    ``RefusedError`` 400/413 for anything else."""
    if len(body) > MAX_ENROL_BYTES:
        raise RefusedError(413, "too-large", "Body too large", f"{len(body)} bytes; at most {MAX_ENROL_BYTES} accepted")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RefusedError(400, "malformed-enrolment", "Malformed enrolment", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise RefusedError(400, "malformed-enrolment", "Malformed enrolment", "the body is not a JSON object")
    key = doc.get("public_key")
    if not (isinstance(key, str) and len(key) == PUBLIC_KEY_HEX and all(c in "0123456789abcdef" for c in key)):
        raise RefusedError(400, "malformed-enrolment", "Malformed enrolment",
                      "public_key must be the raw Ed25519 public key as 64 lowercase hex digits")
    token = doc.get("token")
    if need_token and not isinstance(token, str):
        raise RefusedError(403, "enrolment-refused", "Enrolment refused", "this edge enrols devices with a token only")
    return bytes.fromhex(key), token if isinstance(token, str) else None


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """Token buckets by device id: ``burst`` reports at once, then ``rate`` per second. ``rate <= 0`` turns
    limiting off. At most ``max_devices`` buckets are kept (memory is bounded; a forgotten bucket starts full)."""

    def __init__(self, rate: float, burst: int, max_devices: int = 1 << 18) -> None:
        if burst < 1 or max_devices < 1:
            raise ValueError("burst and max_devices must be at least 1")
        self.rate, self.burst, self.max_devices = float(rate), float(burst), max_devices
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def wait(self, device_id: str, now: float) -> int:
        """0 and one report charged if ``device_id`` may send at ``now`` (monotonic seconds), else the whole
        seconds until it may (the Retry-After)."""
        if self.rate <= 0:
            return 0
        bucket = self._buckets.get(device_id)
        if bucket is None:
            bucket = self._buckets[device_id] = _Bucket(self.burst, now)
            if len(self._buckets) > self.max_devices:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(device_id)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0
        return max(1, math.ceil((1.0 - bucket.tokens) / self.rate))


def keys_payload(analyzer: tuple[str, bytes], shuffler_sealing: tuple[str, bytes]) -> str:
    """The canonical keys document (compact JSON, sorted keys) a device seals to: ids and raw keys as hex."""
    return json.dumps({"version": 1,
                       "analyzer": {"key_id": analyzer[0], "public_key": analyzer[1].hex()},
                       "shuffler": {"key_id": shuffler_sealing[0], "public_key": shuffler_sealing[1].hex()}},
                      sort_keys=True, separators=(",", ":"))


def keys_signing_bytes(payload: str) -> bytes:
    """What the shuffler signs for a keys document: a domain tag, then the payload's UTF-8 bytes."""
    return KEYS_SIGNATURE_TAG + payload.encode("utf-8")
