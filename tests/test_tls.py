"""scriba.tls and scriba.tls_cli without servers: allow-lists, identities, loading, flags."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from scriba.errors import ConfigError, UnauthorizedError
from scriba.testing.pki import ADMIN_IDENTITY, CLIENT_IDENTITY, TestPki
from scriba.tls import (
    Role,
    TlsConfig,
    admitted,
    authorize,
    identities_from_grpc,
    identities_from_peercert,
)
from scriba.tls_cli import add_tls_arguments, tls_from_args


def test_authorize_follows_the_role_allow_lists(pki: TestPki) -> None:
    cfg = pki.server_tls()
    authorize(cfg, frozenset({CLIENT_IDENTITY}), (Role.CLIENT,))  # admitted: no error
    authorize(cfg, frozenset({ADMIN_IDENTITY}), (Role.CLIENT, Role.ADMIN))
    with pytest.raises(UnauthorizedError, match="not on the admin allow-list"):
        authorize(cfg, frozenset({CLIENT_IDENTITY}), (Role.ADMIN,))
    with pytest.raises(UnauthorizedError, match="no client certificate"):
        authorize(cfg, frozenset(), (Role.CLIENT,))


def test_wildcard_and_no_allow_list_admit_any_signed_certificate(pki: TestPki) -> None:
    star = TlsConfig(cert=pki.server.cert, key=pki.server.key, ca=pki.ca.cert, require_client_cert=True,
                     allow={Role.BOOKIE: frozenset({"*"})})
    assert admitted(star, frozenset({"anyone"}), (Role.BOOKIE,))
    assert not admitted(star, frozenset({"anyone"}), (Role.CLIENT,))  # negative control
    assert not admitted(star, frozenset(), (Role.BOOKIE,))
    open_mtls = TlsConfig(cert=pki.server.cert, key=pki.server.key, ca=pki.ca.cert, require_client_cert=True)
    assert admitted(open_mtls, frozenset({"anyone"}), (Role.ADMIN,))


def test_identities_from_certificates(pki: TestPki) -> None:
    decoded = ssl._ssl._test_decode_cert(str(pki.server.cert))  # type: ignore[attr-defined]
    assert identities_from_peercert(decoded) == {"scriba-bookie", "localhost", "127.0.0.1"}
    assert identities_from_peercert(None) == frozenset()
    assert identities_from_grpc({"x509_common_name": [b"a"], "x509_subject_alternative_name": [b"b", b"c"],
                                 "transport_security_type": [b"ssl"]}) == {"a", "b", "c"}


def test_contexts_verify_peers(pki: TestPki) -> None:
    server = pki.server_tls().load().server_ssl_context()
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert pki.server_tls(mutual=False).load().server_ssl_context().verify_mode == ssl.CERT_OPTIONAL
    client = pki.client_tls(pki.client).load().client_ssl_context()
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname


def test_load_names_the_bad_file(pki: TestPki, tmp_path: Path) -> None:
    not_pem = tmp_path / "x.crt"
    not_pem.write_text("hello")
    cases = [
        (TlsConfig(cert=tmp_path / "none.crt", key=pki.server.key), r"tls\.cert .*none\.crt: no such file"),
        (TlsConfig(cert=not_pem, key=pki.server.key), r"tls\.cert .*x\.crt: not a PEM file"),
        (TlsConfig(cert=pki.server.cert, key=pki.client.key), "the key does not match the certificate"),
        (TlsConfig(ca=tmp_path), r"tls\.ca .*: is a directory"),
        (TlsConfig(cert=pki.server.cert, key=pki.server.key, allow={Role.CLIENT: frozenset({"a"})}),
         r"tls\.require_client_cert: must be set with an allow-list"),
    ]
    for cfg, message in cases:
        with pytest.raises(ConfigError, match=message):
            cfg.load()
    pki.server_tls().load()  # positive control


def test_flags_and_config_file(pki: TestPki, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_tls_arguments(parser)
    assert tls_from_args(parser.parse_args([])) is None  # no flags: plaintext
    conf = tmp_path / "tls.yaml"
    conf.write_text(f"cert: {pki.server.cert}\nkey: {pki.server.key}\nca: {pki.ca.cert}\n"
                    "require_client_cert: true\nallow: {client: [w1], admin: [ops]}\n")
    cfg = tls_from_args(parser.parse_args(["--tls-config", str(conf), "--tls-allow", "client=w2"]))
    assert cfg is not None and cfg.require_client_cert and cfg.cert == pki.server.cert
    assert cfg.allow[Role.CLIENT] == {"w1", "w2"} and cfg.allow[Role.ADMIN] == {"ops"}
    with pytest.raises(ConfigError, match="unknown role 'nobody'"):
        tls_from_args(parser.parse_args(["--tls-allow", "nobody=x"]))
    conf.write_text("cert: a\nkeys: b\n")
    with pytest.raises(ConfigError, match="unknown keys keys"):
        tls_from_args(parser.parse_args(["--tls-config", str(conf)]))
