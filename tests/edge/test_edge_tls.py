"""``esa edge --tls_cert --tls_key``: HTTPS with a certificate from a test CA (made by ``cryptography``), keep-alive
across requests, and refusal by a client that does not trust the CA."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import numpy as np
import pytest

from pipelines.edge.client import EdgeClient
from tests.broker.tls import make_tls
from tests.edge.harness import EdgeProcess
from tests.edge.test_edge_service import SPEC
from transforms.device import Client
from transforms.io.kafka.bounded import ensure_topics
from transforms.trust.keys import init_keys

pytestmark = pytest.mark.slow


def test_https_with_keep_alive_and_an_untrusted_ca_refused(broker, topic_name: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    init_keys(keys)
    tls = make_tls(tmp_path / "tls")
    ensure_topics(broker.bootstrap, [topic_name, f"{topic_name}-devices"])
    with EdgeProcess(broker.bootstrap, keys, tmp_path / "spool", tmp_path / "edge.log", "--enrolment", "open",
                     "--reports_topic", topic_name, "--devices_topic", f"{topic_name}-devices",
                     "--tls_cert", str(tls.keystore), "--tls_key", str(tls.keystore)) as edge:
        assert edge.url.startswith("https://127.0.0.1:")
        client = EdgeClient(edge.url, tls=ssl.create_default_context(cafile=str(tls.truststore)))
        current = client.keys()
        socket_used = client._conn.sock  # type: ignore[union-attr]
        device = Client(SPEC, tmp_path / "device", rng=np.random.default_rng(3), **current.client_kwargs())
        assert client.enrol(device.public_key).status == 200
        assert client.post_report(device.encode(4)).status == 202
        assert client._conn.sock is socket_used  # type: ignore[union-attr]  (one connection, kept alive)
        assert isinstance(socket_used, ssl.SSLSocket) and socket_used.version() in ("TLSv1.2", "TLSv1.3")
        client.close()

        other_ca = make_tls(tmp_path / "other", ca_name="another CA")
        stranger = EdgeClient(edge.url, tls=ssl.create_default_context(cafile=str(other_ca.truststore)))
        with pytest.raises(ssl.SSLCertVerificationError):
            stranger.request("GET", "/healthz")
        plain = EdgeClient(edge.url.replace("https://", "http://"), timeout_s=10)
        with pytest.raises((OSError, http.client.HTTPException)):  # plaintext on the TLS port: no HTTP answer
            plain.request("GET", "/healthz")
