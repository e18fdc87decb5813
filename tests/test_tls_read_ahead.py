"""OpenSSL's read-ahead for ``scriba.tls_socket``'s contexts (``scriba.tls_read_ahead``):
set through ``libssl`` on the context's own ``SSL_CTX``, and only once that pointer is
proved; otherwise left off with a warning, never a crash."""

from __future__ import annotations

import pytest

from scriba import tls_read_ahead
from scriba.testing.pki import TestPki


def test_read_ahead_is_set_on_the_context_itself(pki: TestPki) -> None:
    context = pki.client_tls(pki.client).load().client_ssl_context()
    assert tls_read_ahead.read_ahead(context) is False  # OpenSSL's default
    assert tls_read_ahead.enable_read_ahead(context) is True
    assert tls_read_ahead.read_ahead(context) is True
    assert tls_read_ahead.enable_read_ahead(context) is True  # idempotent
    other = pki.client_tls(pki.client).load().client_ssl_context()
    assert tls_read_ahead.read_ahead(other) is False  # another context is not touched


def test_a_pointer_that_is_not_proved_leaves_read_ahead_off(pki: TestPki, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tls_read_ahead.load_libssl()
    assert lib is not None
    context = pki.client_tls(pki.client).load().client_ssl_context()
    real = lib.get_options
    monkeypatch.setattr(lib, "get_options", lambda pointer: real(pointer) ^ 1)  # (a layout not recognised)
    monkeypatch.setattr(tls_read_ahead, "_unavailable", None)
    calls: list[int] = []
    monkeypatch.setattr(lib, "ctrl", lambda *args: calls.append(args[1]) or 0)
    assert tls_read_ahead.enable_read_ahead(context) is False
    assert tls_read_ahead.read_ahead(context) is None
    assert calls == []  # nothing was written through the unproved pointer
    assert tls_read_ahead._unavailable == "SSLContext layout not recognised"

