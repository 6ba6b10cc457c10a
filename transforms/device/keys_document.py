"""The device's side of ``GET /v1/keys``: check the shuffler's signature, then take the keys to seal to.

Why signed: a device follows key rotation by fetching this document, so whoever could alter it in transit (or a
proxy caching it) could make devices seal to their key. The device pins the shuffler's signing public key
(shipped with the app); ``pinned=None`` trusts the key named in the document itself (first use, demos only).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from transforms.trust.canonical import KEYS_DOCUMENT_TAG as KEYS_SIGNATURE_TAG

__all__ = ["KEYS_SIGNATURE_TAG", "CurrentKeys", "KeysDocumentError", "read_keys_document"]


class KeysDocumentError(ValueError):
    """A keys document that is malformed or not signed by the pinned shuffler key."""


class CurrentKeys(NamedTuple):
    analyzer_key_id: str
    analyzer_public_key: X25519PublicKey
    shuffler_key_id: str
    shuffler_public_key: X25519PublicKey

    def client_kwargs(self) -> dict[str, object]:
        """The keyword arguments ``Client`` takes for its keys."""
        return {"analyzer_public_key": self.analyzer_public_key, "analyzer_key_id": self.analyzer_key_id,
                "shuffler_public_key": self.shuffler_public_key, "shuffler_key_id": self.shuffler_key_id}


def read_keys_document(body: bytes, pinned: Ed25519PublicKey | None) -> CurrentKeys:
    """The current keys of a ``GET /v1/keys`` body, once its signature verifies; ``KeysDocumentError`` if not."""
    try:
        outer = json.loads(body)
        payload = outer["payload"]
        signature = bytes.fromhex(outer["signature"])
        signer = pinned or Ed25519PublicKey.from_public_bytes(bytes.fromhex(outer["signing_public_key"]))
        signer.verify(signature, KEYS_SIGNATURE_TAG + payload.encode("utf-8"))
        doc = json.loads(payload)
        if doc.get("version") != 1:
            raise KeysDocumentError(f"unsupported keys document version {doc.get('version')!r}")
        analyzer, shuffler = doc["analyzer"], doc["shuffler"]
        return CurrentKeys(analyzer["key_id"], X25519PublicKey.from_public_bytes(bytes.fromhex(analyzer["public_key"])),
                           shuffler["key_id"], X25519PublicKey.from_public_bytes(bytes.fromhex(shuffler["public_key"])))
    except InvalidSignature:
        raise KeysDocumentError("the keys document is not signed by the shuffler's key") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        if isinstance(err, KeysDocumentError):
            raise
        raise KeysDocumentError(f"malformed keys document ({type(err).__name__}: {err})") from None
