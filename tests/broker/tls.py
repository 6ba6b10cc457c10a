"""A test certificate authority and a broker certificate for 127.0.0.1, made with `cryptography`.

Why real certificates: the security tests must show the broker refusing a client that does not trust its
CA and a plaintext client on its TLS port, which only a real TLS handshake can show.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    keystore: Path  # the broker's key (PKCS#8) + certificate + CA certificate
    truststore: Path  # the CA certificate clients verify the broker with


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, issuer: str, public_key: ec.EllipticCurvePublicKey, signer: ec.EllipticCurvePrivateKey,
                 *, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_tls(directory: Path, ca_name: str = "esa test CA") -> TlsFiles:
    """A fresh CA and a broker certificate signed by it, written as the broker's PEM key and trust stores."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, broker_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    broker_cert = _certificate("127.0.0.1", ca_name, broker_key.public_key(), ca_key, ca=False)
    key_pem = broker_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())
    files = TlsFiles(directory / "broker-keystore.pem", directory / "ca.pem")
    files.keystore.write_bytes(key_pem + _pem(broker_cert) + _pem(ca_cert))
    files.truststore.write_bytes(_pem(ca_cert))
    return files
