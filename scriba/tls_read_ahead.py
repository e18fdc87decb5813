"""OpenSSL's read-ahead for the contexts of :mod:`scriba.tls_socket`, which Python's ``ssl``
module does not expose (``SSL_CTX_set_read_ahead``; CPython 3.11 has no setter).

Without read-ahead OpenSSL reads each record with two ``recv`` calls, its 5-byte header
and then its body; with it, one ``recv`` fills OpenSSL's buffer (``READ_BUFFER_BYTES``)
with as many records as the socket holds. On the data path a bookie receives 16 KiB
records in bursts, so that halves (or better) the reads per record. In one process over
loopback (``benchmarks/probe_tls_transport.py``) it took what TLS adds from 1.092 to
1.019 ms of CPU per MiB moved (-6.7%) and from 48.2 to 46.2 us per small round trip
(-4.1%); on the data path (``bench_tls.py``) the saving is below the rounds' noise.

The call goes through ``ctypes`` into the ``libssl`` that ``_ssl`` already loaded, with
the ``SSL_CTX *`` read from the ``SSLContext`` object (CPython's ``PySSLContext`` holds it
right after the object header). Before using that pointer the module proves it: the
library's version must be ``ssl.OPENSSL_VERSION_NUMBER``, and ``SSL_CTX_get_options``
through the pointer must equal ``context.options``. When anything does not hold (another
interpreter, another layout, another library), read-ahead stays off and
``tls_read_ahead_unavailable`` is logged once: it is an optimisation, never needed.

What read-ahead asks of a transport, which :class:`scriba.tls_socket.TlsSocketTransport`
does: records OpenSSL read ahead are no longer signalled by the socket, so every read
drains until ``SSLWantReadError``, and a new connection reads at once after its
handshake (whose last ``recv`` may have read the peer's first records too).
"""

from __future__ import annotations

import ctypes
import ssl
import sys
from typing import Final

from scriba.log import get_logger

log = get_logger(__name__)

__all__ = ["READ_BUFFER_BYTES", "enable_read_ahead", "load_libssl", "openssl_soname", "proved_context", "read_ahead"]

READ_BUFFER_BYTES: Final = 64 * 1024
_SSL_CTRL_GET_READ_AHEAD: Final = 40
_SSL_CTRL_SET_READ_AHEAD: Final = 41
_CTX_OFFSET: Final = 2 * ctypes.sizeof(ctypes.c_void_p)  # PyObject_HEAD: refcount, type


class _Libssl:
    """The few ``libssl`` functions used, typed for ``ctypes``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.version = lib.OpenSSL_version_num
        self.version.restype, self.version.argtypes = ctypes.c_ulong, []
        self.get_options = lib.SSL_CTX_get_options
        self.get_options.restype, self.get_options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
        self.ctrl = lib.SSL_CTX_ctrl
        self.ctrl.restype = ctypes.c_long
        self.ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        self.set_read_buffer = lib.SSL_CTX_set_default_read_buffer_len
        self.set_read_buffer.restype, self.set_read_buffer.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t]


_lib: _Libssl | None = None
_unavailable: str | None = None


def openssl_soname(library: str) -> str:
    """The file name of OpenSSL's ``library`` (``libssl``, ``libcrypto``) of the version ``ssl`` uses."""
    major, minor = ssl.OPENSSL_VERSION_INFO[:2]
    return f"{library}.so.3" if major >= 3 else f"{library}.so.{major}.{minor}"


def load_libssl() -> _Libssl | None:
    """The ``libssl`` that ``ssl`` uses, proved by its version; None (logged once) if not here."""
    global _lib, _unavailable
    if _lib is not None or _unavailable is not None:
        return _lib
    try:
        if sys.implementation.name != "cpython" or hasattr(sys, "getobjects"):  # (a Py_TRACE_REFS build)
            raise OSError(f"not a plain CPython build: {sys.implementation.name}")
        lib = _Libssl(ctypes.CDLL(openssl_soname("libssl")))
        if lib.version() != ssl.OPENSSL_VERSION_NUMBER:
            raise OSError(f"libssl {lib.version():#x} is not the one ssl uses ({ssl.OPENSSL_VERSION_NUMBER:#x})")
        _lib = lib
    except (OSError, AttributeError) as exc:
        _unavailable = str(exc)
        log.warning("tls_read_ahead_unavailable", reason=_unavailable)
    return _lib


def _ctx_pointer(lib: _Libssl, context: ssl.SSLContext) -> int | None:
    """The context's ``SSL_CTX *``, proved by reading its options through it; None if not."""
    global _unavailable
    pointer = ctypes.c_void_p.from_address(id(context) + _CTX_OFFSET).value
    if pointer and lib.get_options(pointer) == int(context.options):
        return pointer
    if _unavailable is None:
        _unavailable = "SSLContext layout not recognised"
        log.warning("tls_read_ahead_unavailable", reason=_unavailable)
    return None


def proved_context(context: ssl.SSLContext) -> tuple[_Libssl, int] | None:
    """The library and the context's proved ``SSL_CTX *``; None if either cannot be had here."""
    lib = load_libssl()
    pointer = None if lib is None else _ctx_pointer(lib, context)
    return None if lib is None or pointer is None else (lib, pointer)


def enable_read_ahead(context: ssl.SSLContext) -> bool:
    """Turn on read-ahead (with a ``READ_BUFFER_BYTES`` buffer) for connections made from
    ``context`` from now on; idempotent. False if it cannot be done here (module docstring)."""
    proved = proved_context(context)
    if proved is None:
        return False
    lib, pointer = proved
    lib.ctrl(pointer, _SSL_CTRL_SET_READ_AHEAD, 1, None)
    lib.set_read_buffer(pointer, READ_BUFFER_BYTES)
    return True


def read_ahead(context: ssl.SSLContext) -> bool | None:
    """Whether ``context`` reads ahead (None: cannot be told here)."""
    proved = proved_context(context)
    if proved is None:
        return None
    lib, pointer = proved
    return bool(lib.ctrl(pointer, _SSL_CTRL_GET_READ_AHEAD, 0, None))
