"""The keys the edge holds, re-read from the keys directory so a rotation reaches devices without a restart.

The edge opens the outer layer of reports (so it holds every shuffler sealing private key, as the shuffler does)
and signs the keys document with the shuffler's newest signing key: it is inside the shuffler's trust domain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transforms.shuffler.edge_admission import keys_payload, keys_signing_bytes
from transforms.trust.keys import (
    load_analyzer_public,
    load_shuffler_sealing_private,
    load_shuffler_sealing_public,
    load_shuffler_signer,
)

_log = logging.getLogger("esa.edge")


class KeyRing:
    """``sealing_private`` (every id) and the signed keys document, replaced whole by ``reload``."""

    def __init__(self, keys_dir: Path) -> None:
        self.keys_dir = Path(keys_dir)
        self._lock = threading.Lock()
        self.sealing_private: dict[str, X25519PrivateKey] = {}
        self._document = (b"", "")
        self.reload()

    def reload(self) -> bool:
        """Re-read the keys; True if the document changed. A failing read keeps the keys in force."""
        analyzer_id, analyzer = load_analyzer_public(self.keys_dir)
        sealing_id, sealing = load_shuffler_sealing_public(self.keys_dir)
        signing_id, signer = load_shuffler_signer(self.keys_dir)
        private = load_shuffler_sealing_private(self.keys_dir)
        payload = keys_payload((analyzer_id, analyzer.public_bytes_raw()), (sealing_id, sealing.public_bytes_raw()))
        body = json.dumps({"payload": payload, "signature": signer.sign(keys_signing_bytes(payload)).hex(),
                           "signing_key_id": signing_id,
                           "signing_public_key": signer.public_key().public_bytes_raw().hex()},
                          separators=(",", ":")).encode()
        etag = '"' + hashlib.sha256(payload.encode()).hexdigest()[:32] + '"'
        with self._lock:
            changed = etag != self._document[1]
            self.sealing_private = private
            self._document = (body, etag)
        if changed:
            _log.info("edge: keys in force: analyzer %s, shuffler sealing %s, signed by %s", analyzer_id, sealing_id,
                      signing_id)
        return changed

    def document(self) -> tuple[bytes, str]:
        """(the ``GET /v1/keys`` body, its ETag)."""
        return self._document
