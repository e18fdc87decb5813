"""A throwaway certificate authority for the sandbox and the tests (``cryptography``).

:func:`make_ca` writes a self-signed CA; :func:`issue` writes a certificate it signs
for one identity (subject CN plus DNS/IP subject alternative names), usable for
serving and for client authentication. Keys are ECDSA P-256 (fast to make, small),
files are PEM, private keys are written mode 0600. Nothing here is for production
PKI: no revocation, no intermediates, fixed validity.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scriba.errors import ConfigError

VALIDITY_DAYS_DEFAULT = 30


@dataclass(frozen=True, slots=True)
class Issued:
    """Paths of one certificate and its key (and of the CA that signed it)."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    cert: Path
    key: Path
    name: str


def _crypto() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise ConfigError("generating certificates needs the 'cryptography' package (pip install cryptography)") \
            from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write_key(path: Path, key: Any) -> None:
    _, _, serialization, _, _, _ = _crypto()
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_ca(directory: Path, name: str = "scriba-sandbox-ca", *, days: int = VALIDITY_DAYS_DEFAULT) -> CertificateAuthority:
    """A self-signed CA in ``directory`` (``<name>.crt``, ``<name>.key``)."""
    x509, hashes, serialization, ec, _, NameOID = _crypto()
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca = CertificateAuthority(directory / f"{name}.crt", directory / f"{name}.key", name)
    ca.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca.key, key)
    return ca


def issue(
    ca: CertificateAuthority,
    directory: Path,
    name: str,
    *,
    dns: Sequence[str] = ("localhost",),
    ips: Sequence[str] = ("127.0.0.1",),
    days: int = VALIDITY_DAYS_DEFAULT,
    not_before: datetime.datetime | None = None,
) -> Issued:
    """A certificate for identity ``name`` signed by ``ca`` (``<name>.crt``, ``<name>.key``).

    Valid for serving and for client authentication; SANs: ``dns`` names and ``ips``.
    ``days`` may be negative with an earlier ``not_before`` (an expired certificate).
    """
    x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID = _crypto()
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    sans: list[Any] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    issued = Issued(directory / f"{name}.crt", directory / f"{name}.key", ca.cert)
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(issued.key, key)
    return issued
