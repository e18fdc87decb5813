"""A write buffer under each connection of :mod:`scriba.tls_socket`, so that the records of
one write leave with one system call, which Python's ``ssl`` module cannot ask for.

Why: OpenSSL writes every record to its socket on its own, so a 64 KiB write (as
:mod:`scriba.frame_write` joins the data path's frames) left as four ``write`` calls of
16 KiB, where plaintext sends a whole message of many adds with one. On the data path
(three bookies, 1 KiB entries, 1,000 in flight) the client made 0.24 system calls per
entry over TLS against 0.007 in plaintext, and on loopback each call also runs the
receiving side and wakes a bookie. ``TCP_CORK`` around the write saved nothing (the calls
stay). With the buffer, the client's CPU per entry fell from 10.25 to 9.4 us (plaintext
7.75; medians of 6 alternating rounds): a third of what TLS added to the client; over 40
rounds of ``bench_tls.py`` each, the median throughput loss of TLS went from 17.8% to
12.0%. A small write pays one more call through ``ctypes`` (about 0.9 us of CPU).

How: OpenSSL's buffering BIO (``BIO_f_buffer``, ``WRITE_BUFFER_BYTES``) is pushed in
front of the connection's socket BIO and made its write BIO (``SSL_set0_wbio``); reads
stay on the socket BIO (and read ahead, :mod:`scriba.tls_read_ahead`). The transport
flushes after each write it hands to OpenSSL; OpenSSL flushes its own alerts (a
close_notify included) and handshake messages (a key update's answer). The ``SSL *`` is
read from the ``SSLSocket``'s ``_sslobj`` (CPython's ``PySSLSocket`` holds it after the
object header and a weak reference to the socket) and proved before any use: its
``SSL_CTX *`` must be the context's proved one (:func:`scriba.tls_read_ahead.proved_context`),
its file descriptor the socket's, and its read and write BIO the one socket BIO that
``ssl`` set. When anything does not hold, the connection keeps writing to its socket and
``tls_write_buffer_unavailable`` is logged once: an optimisation, never needed.
:class:`WriteBuffer` holds the ``_sslobj``, and with it the ``SSL`` that owns the BIO.

What it asks of a transport, which ``TlsSocketTransport`` does: flush after every write
OpenSSL took whole; when a flush cannot finish (the socket is full), wait until it is
writable and flush again, and close only when nothing is left in the buffer. A full
buffer that cannot flush makes OpenSSL's write fail with ``SSLWantWriteError``, as the
socket did: that write is retried with the same bytes, as before.
"""

from __future__ import annotations

import ctypes
import ssl
import sys
from typing import Any, Final

from scriba.log import get_logger
from scriba.tls_read_ahead import openssl_soname, proved_context

log = get_logger(__name__)

__all__ = ["WRITE_BUFFER_BYTES", "WriteBuffer", "attach_write_buffer"]

WRITE_BUFFER_BYTES: Final = 128 * 1024  # a 64 KiB write's records (and a few parts more)
_SSL_OFFSET: Final = 3 * ctypes.sizeof(ctypes.c_void_p)  # PyObject_HEAD (refcount, type), Socket
_LAYOUTS: Final = {(3, 10), (3, 11), (3, 12), (3, 13)}  # PySSLSocket starts {HEAD; Socket; SSL *ssl}
_BIO_C_SET_BUFF_SIZE: Final = 117
_BIO_CTRL_FLUSH: Final = 11
_BIO_CTRL_WPENDING: Final = 13
_BIO_FLAGS_SHOULD_RETRY: Final = 8
_P = ctypes.c_void_p


class _Lib:
    """The ``libssl`` and ``libcrypto`` functions used, typed for ``ctypes``."""

    def __init__(self) -> None:
        libssl = ctypes.CDLL(openssl_soname("libssl"))
        libcrypto = ctypes.CDLL(openssl_soname("libcrypto"), use_errno=True)

        def fn(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, list(argtypes)
            return f

        self.get_ctx = fn(libssl, "SSL_get_SSL_CTX", _P, _P)
        self.get_fd = fn(libssl, "SSL_get_fd", ctypes.c_int, _P)
        self.get_rbio = fn(libssl, "SSL_get_rbio", _P, _P)
        self.get_wbio = fn(libssl, "SSL_get_wbio", _P, _P)
        self.set0_wbio = fn(libssl, "SSL_set0_wbio", None, _P, _P)
        self.f_buffer = fn(libcrypto, "BIO_f_buffer", _P)
        self.new = fn(libcrypto, "BIO_new", _P, _P)
        self.free = fn(libcrypto, "BIO_free", ctypes.c_int, _P)
        self.up_ref = fn(libcrypto, "BIO_up_ref", ctypes.c_int, _P)
        self.push = fn(libcrypto, "BIO_push", _P, _P, _P)
        self.ctrl = fn(libcrypto, "BIO_ctrl", ctypes.c_long, _P, ctypes.c_int, ctypes.c_long, _P)
        self.test_flags = fn(libcrypto, "BIO_test_flags", ctypes.c_int, _P, ctypes.c_int)


_lib: _Lib | None = None
_unavailable: str | None = None


def _unavailable_because(reason: str) -> None:
    global _unavailable
    if _unavailable is None:
        _unavailable = reason
        log.warning("tls_write_buffer_unavailable", reason=reason)


def _load() -> _Lib | None:
    global _lib
    if _lib is None and _unavailable is None:
        try:
            if sys.version_info[:2] not in _LAYOUTS:
                raise OSError(f"PySSLSocket's layout is not known for Python {sys.version_info[:2]}")
            _lib = _Lib()
        except (OSError, AttributeError) as exc:
            _unavailable_because(str(exc))
    return _lib


def _ssl_pointer(lib: _Lib, sock: ssl.SSLSocket, context: ssl.SSLContext) -> int | None:
    """The connection's ``SSL *``, proved (module docstring); None if it cannot be."""
    proved = proved_context(context)  # the library's version and the context's pointer first
    sslobj = getattr(sock, "_sslobj", None)
    if proved is None or sslobj is None:
        return None
    pointer = ctypes.c_void_p.from_address(id(sslobj) + _SSL_OFFSET).value
    if (pointer and lib.get_ctx(pointer) == proved[1] and lib.get_fd(pointer) == sock.fileno()
            and lib.get_rbio(pointer) == lib.get_wbio(pointer)):
        return pointer
    _unavailable_because("PySSLSocket layout not recognised")
    return None


class WriteBuffer:
    """The buffering BIO a connection's records are written to (module docstring)."""

    def __init__(self, lib: _Lib, sslobj: object, bio: int) -> None:
        self._lib = lib
        self._sslobj = sslobj  # keeps the SSL, which owns the BIO, alive
        self._bio = bio

    def flush(self) -> bool:
        """Send what the buffer holds: True when all of it went, False when the socket
        would block (flush again when it is writable); ``OSError`` if the socket failed."""
        if self._lib.ctrl(self._bio, _BIO_CTRL_FLUSH, 0, None) > 0:
            return True
        if self._lib.test_flags(self._bio, _BIO_FLAGS_SHOULD_RETRY):
            return False
        errno = ctypes.get_errno()
        raise OSError(errno, f"sending the TLS write buffer failed (errno {errno})")

    def pending(self) -> int:
        """Bytes in the buffer, not yet sent."""
        return int(self._lib.ctrl(self._bio, _BIO_CTRL_WPENDING, 0, None))


def attach_write_buffer(sock: ssl.SSLSocket, context: ssl.SSLContext) -> WriteBuffer | None:
    """Put a write buffer under ``sock`` (its handshake done, made from ``context``); None,
    leaving it as it was, when that cannot be done here (module docstring)."""
    lib = _load()
    pointer = None if lib is None else _ssl_pointer(lib, sock, context)
    if lib is None or pointer is None:
        return None
    socket_bio = lib.get_wbio(pointer)
    bio = lib.new(lib.f_buffer())
    if not bio:
        _unavailable_because("BIO_new failed")
        return None
    if lib.ctrl(bio, _BIO_C_SET_BUFF_SIZE, WRITE_BUFFER_BYTES, ctypes.byref(ctypes.c_int(1))) <= 0:  # 1: output
        lib.free(bio)
        _unavailable_because("BIO_set_write_buffer_size failed")
        return None
    lib.up_ref(socket_bio)  # the chain's reference: the SSL frees its write BIO chain and its read BIO
    lib.push(bio, socket_bio)
    lib.set0_wbio(pointer, bio)  # drops the SSL's write reference to the socket BIO
    return WriteBuffer(lib, sock._sslobj, bio)  # type: ignore[attr-defined]
