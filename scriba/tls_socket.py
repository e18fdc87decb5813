"""TLS for the binary data path on a non-blocking ``ssl.SSLSocket``, driven by the loop's
reader and writer callbacks, instead of asyncio's ``sslproto``.

Why: ``sslproto`` runs TLS over memory BIOs, in Python. Each read is copied into the
incoming BIO (which OpenSSL zero-fills before it copies), each record is read out of it
in a Python loop, and each write's ciphertext is read out of the outgoing BIO as a new
``bytes`` and handed to the socket transport. An ``SSLSocket`` lets OpenSSL read and
write the socket itself: no BIO copies, no zero-fill, and one Python call per record
read or per 64 KiB written; with OpenSSL's read-ahead (:mod:`scriba.tls_read_ahead`) one
``recv`` reads several records, and with a write buffer (:mod:`scriba.tls_write_buffer`)
one ``write`` sends the records of a write. In one process over loopback
(``benchmarks/probe_tls_transport.py``), TLS added 1.76 ms of CPU per MiB moved in 64 KiB
writes through ``sslproto`` and 1.22 ms through this module (plaintext: 0.53 ms), and
79.9 us and 49.7 us to a round trip of 1 KiB and 40 bytes (plaintext: 29.5 us).

:func:`open_connection` dials, shakes hands and returns the transport and its protocol,
as ``loop.create_connection(..., ssl=...)`` does; :func:`scriba.tls_server.start_server`
is the listening side.

:class:`TlsSocketTransport` is an ``asyncio.Transport``: ``write`` / ``writelines``,
flow control (``pause_writing`` / ``resume_writing`` around the high and low water
marks of what is queued), ``pause_reading`` / ``resume_reading``, ``close`` (what is
queued is sent, then a close_notify) and ``abort``; ``get_extra_info`` answers
``sslcontext``, ``ssl_object``, ``peercert``, ``cipher``, ``socket``, ``peername`` and
``sockname``. Protocols may be ``asyncio.BufferedProtocol``s (records are read straight
into their buffer, several per ``buffer_updated``) or plain ``asyncio.Protocol``s.

OpenSSL's rules the transport keeps:
- a write that raised ``SSLWantWriteError`` is retried with the same bytes before any
  other (OpenSSL has sealed part of it already);
- with the write buffer, every write OpenSSL took whole is flushed; a flush the socket
  stopped is finished when it is writable, and ``close`` waits for it as for the queue;
- OpenSSL may hold records the socket no longer signals (decrypted, or read ahead), so
  a read drains until ``SSLWantReadError``, and ``resume_reading`` and a new connection
  (whose handshake may have read the peer's first records) read at once;
- a read may need the socket writable, and a write readable (``SSLWantWriteError`` on a
  read, ``SSLWantReadError`` on a write): each then waits for that event and retries.

``SCRIBA_TLS_TRANSPORT=asyncio`` puts the data path back on ``sslproto``
(:func:`use_tls_socket`), to compare or to fall back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from scriba.log import get_logger
from scriba.tls_read_ahead import enable_read_ahead
from scriba.tls_write_buffer import attach_write_buffer

log = get_logger(__name__)

__all__ = [
    "HANDSHAKE_TIMEOUT_S",
    "TlsSocketTransport",
    "address",
    "handshake",
    "open_connection",
    "until_ready",
    "use_tls_socket",
]

P = TypeVar("P", bound=asyncio.BaseProtocol)

HIGH_WATER_BYTES: Final = 64 * 1024
LOW_WATER_BYTES: Final = 16 * 1024
READ_BYTES_PER_CALL: Final = 1024 * 1024  # then yield to the loop (and come back at once)
PLAIN_READ_BYTES: Final = 256 * 1024  # for a protocol that is not a BufferedProtocol
HANDSHAKE_TIMEOUT_S: Final = 10.0


def use_tls_socket() -> bool:
    """Whether the data path runs TLS on this module (``SCRIBA_TLS_TRANSPORT`` is not ``asyncio``)."""
    return os.environ.get("SCRIBA_TLS_TRANSPORT", "socket").strip().lower() != "asyncio"


class TlsSocketTransport(asyncio.Transport):
    """One TLS connection after its handshake (module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, protocol: asyncio.BaseProtocol,
                 context: ssl.SSLContext) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._extra: dict[str, Any] = {
            "sslcontext": context,
            "ssl_object": sock,
            "peercert": sock.getpeercert(),
            "cipher": sock.cipher(),
            "socket": sock,
            "peername": address(sock.getpeername),
            "sockname": address(sock.getsockname),
        }
        self._queue: collections.deque[bytes] = collections.deque()  # the head may be a retried write
        self._queued = 0
        self._high, self._low = HIGH_WATER_BYTES, LOW_WATER_BYTES
        self._writing_paused = False
        self._reading = True
        self._closing = False
        self._closed = False
        self._read_wants_write = False  # a read raised SSLWantWriteError: retry it when writable
        self._write_wants_read = False  # a write raised SSLWantReadError: retry it when readable
        self._writer_added = False
        self._plain_buffer: bytearray | None = None
        self._write_buffer = attach_write_buffer(sock, context)  # None: OpenSSL writes each record itself
        self._flush_pending = False
        protocol.connection_made(self)
        if self.is_reading():  # (connection_made may have paused reading, or closed)
            loop.add_reader(self._fd, self._read_ready)
            loop.call_soon(self._read_ready)  # the handshake may have read records ahead

    # --- asyncio.BaseTransport ----------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def close(self) -> None:
        """Send what is queued, then a close_notify, then close."""
        if self._closing or self._closed:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._queue and not self._flush_pending:
            self._finish_close(None)

    def abort(self) -> None:
        """Close at once; what is queued is dropped."""
        self._force_close(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # --- reading ------------------------------------------------------------------------
    def is_reading(self) -> bool:
        return self._reading and not self._closing and not self._closed

    def pause_reading(self) -> None:
        if self._closing or self._closed or not self._reading:
            return
        self._reading = False
        self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if self._closing or self._closed or self._reading:
            return
        self._reading = True
        self._loop.add_reader(self._fd, self._read_ready)
        self._loop.call_soon(self._read_ready)  # OpenSSL may already hold records

    def _read_ready(self) -> None:
        if self._write_wants_read:
            self._write_wants_read = False
            self._write_ready()
        if not self.is_reading():
            if not self._write_wants_read and not self._closed:
                self._loop.remove_reader(self._fd)  # registered only for a write's sake
            return
        if isinstance(self._protocol, asyncio.BufferedProtocol):
            self._read_buffered(self._protocol)
        else:
            self._read_plain()

    def _read_buffered(self, protocol: asyncio.BufferedProtocol) -> None:
        total = 0
        while self.is_reading() and total < READ_BYTES_PER_CALL:
            buf = memoryview(protocol.get_buffer(-1)).cast("B")
            filled, more = self._recv_into(buf)
            if filled:
                total += filled
                protocol.buffer_updated(filled)
            if not more:
                return
        if self.is_reading():
            self._loop.call_soon(self._read_ready)

    def _read_plain(self) -> None:
        if self._plain_buffer is None:
            self._plain_buffer = bytearray(PLAIN_READ_BYTES)
        view = memoryview(self._plain_buffer)
        total = 0
        while self.is_reading() and total < READ_BYTES_PER_CALL:
            filled, more = self._recv_into(view)
            if filled:
                total += filled
                self._protocol.data_received(bytes(view[:filled]))  # type: ignore[attr-defined]
            if not more:
                return
        if self.is_reading():
            self._loop.call_soon(self._read_ready)

    def _recv_into(self, buf: memoryview) -> tuple[int, bool]:
        """Fill ``buf`` with as many records as OpenSSL yields now: (bytes, whether more may come
        at once). The end of the stream and errors end the connection."""
        filled = 0
        while filled < len(buf):
            try:
                n = self._sock.recv_into(buf[filled:])
            except ssl.SSLWantReadError:
                return filled, False
            except ssl.SSLWantWriteError:
                self._read_wants_write = True
                self._add_writer()
                return filled, False
            except OSError as exc:  # ssl.SSLError included
                self._hand_over_then(filled, buf, functools.partial(self._force_close, exc))
                return 0, False
            if n == 0:
                self._hand_over_then(filled, buf, self._eof)
                return 0, False
            filled += n
        return filled, True

    def _hand_over_then(self, filled: int, buf: memoryview, then: Callable[[], None]) -> None:
        """Deliver what was read before the end or the error, then act on it."""
        if filled:
            if isinstance(self._protocol, asyncio.BufferedProtocol):
                self._protocol.buffer_updated(filled)
            else:
                self._protocol.data_received(bytes(buf[:filled]))  # type: ignore[attr-defined]
        then()

    def _eof(self) -> None:
        if self._closed:
            return
        keep_open = False
        eof_received = getattr(self._protocol, "eof_received", None)
        if eof_received is not None:
            keep_open = bool(eof_received())
        if keep_open and not self._closing:
            self.pause_reading()  # half-close: the peer sends no more, we still may
        else:
            self.close()

    # --- writing ------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._closed:
            return
        if not data:
            return
        chunk = bytes(data)
        if not self._queue and not self._write_wants_read:
            try:
                sent = self._sock.send(chunk)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError) as exc:
                self._wait_to_write(exc)  # and the chunk is queued first: retried with these bytes
            except OSError as exc:
                self._force_close(exc)
                return
            else:
                if sent == len(chunk):
                    self._flush()  # the records of this write leave together
                    return
                chunk = chunk[sent:]  # a partial write (OpenSSL's partial mode is off: not expected)
                self._add_writer()
        self._queue.append(chunk)
        self._queued += len(chunk)
        self._maybe_pause()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS 1.3 has no half-close: close() sends close_notify")

    def get_write_buffer_size(self) -> int:
        return self._queued

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        high = HIGH_WATER_BYTES if high is None else high
        low = high // 4 if low is None else low
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause()

    def _flush(self) -> bool:
        """Send what the write buffer holds; False if some must wait for the socket."""
        if self._write_buffer is None or self._closed:
            return True
        try:
            done = self._write_buffer.flush()
        except OSError as exc:
            self._force_close(exc)
            return False
        self._flush_pending = not done
        if not done:
            self._add_writer()
        return done

    def _wait_to_write(self, exc: BaseException) -> None:
        if isinstance(exc, ssl.SSLWantReadError):
            self._write_wants_read = True  # _read_ready retries the write first
            if not self.is_reading():
                self._loop.add_reader(self._fd, self._read_ready)  # for the write's sake
        else:
            self._add_writer()

    def _add_writer(self) -> None:
        if not self._writer_added:
            self._writer_added = True
            self._loop.add_writer(self._fd, self._write_ready)

    def _remove_writer(self) -> None:
        if self._writer_added:
            self._writer_added = False
            self._loop.remove_writer(self._fd)

    def _write_ready(self) -> None:
        if self._closed:
            return
        if self._read_wants_write:
            self._read_wants_write = False
            if self.is_reading():
                self._loop.call_soon(self._read_ready)
        while self._queue:
            head = self._queue[0]
            try:
                sent = self._sock.send(head)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError) as exc:
                if isinstance(exc, ssl.SSLWantReadError):
                    self._remove_writer()
                self._wait_to_write(exc)
                return
            except OSError as exc:
                self._force_close(exc)
                return
            self._queued -= sent
            if sent < len(head):
                self._queue[0] = head[sent:]
                continue
            self._queue.popleft()
        if not self._flush():
            return
        self._remove_writer()
        self._maybe_resume()
        if self._closing:
            self._finish_close(None)

    def _maybe_pause(self) -> None:
        if self._writing_paused or self._queued <= self._high:
            return
        self._writing_paused = True
        try:
            self._protocol.pause_writing()
        except Exception:  # a protocol's bug must not break the transport
            log.exception("tls_pause_writing_failed")

    def _maybe_resume(self) -> None:
        if not self._writing_paused or self._queued > self._low:
            return
        self._writing_paused = False
        try:
            self._protocol.resume_writing()
        except Exception:
            log.exception("tls_resume_writing_failed")

    # --- the end ------------------------------------------------------------------------
    def _finish_close(self, exc: Exception | None) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._sock.unwrap()  # sends close_notify; does not wait for the peer's
        self._force_close(exc)

    def _force_close(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._closing = True
        self._loop.remove_reader(self._fd)
        self._remove_writer()
        self._queue.clear()
        self._queued = 0
        with contextlib.suppress(OSError):
            self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)


def address(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except OSError:
        return None


async def handshake(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket) -> None:
    """Drive a non-blocking handshake to its end (the caller bounds it in time)."""
    fd = sock.fileno()
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            await until_ready(loop, fd, readable=True)
        except ssl.SSLWantWriteError:
            await until_ready(loop, fd, readable=False)


async def until_ready(loop: asyncio.AbstractEventLoop, fd: int, *, readable: bool) -> None:
    """Wait until ``fd`` is readable (or writable)."""
    add, remove = (loop.add_reader, loop.remove_reader) if readable else (loop.add_writer, loop.remove_writer)
    ready: asyncio.Future[None] = loop.create_future()
    add(fd, _set_once, ready)
    try:
        await ready
    finally:
        remove(fd)


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def open_connection(protocol_factory: Callable[[], P], host: str, port: int, *,
                          ssl_context: ssl.SSLContext, server_hostname: str | None) -> tuple[TlsSocketTransport, P]:
    """Dial ``host:port``, shake hands (the caller bounds the time), start the protocol."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, type_, proto, _, address in infos:
        raw = socket.socket(family, type_, proto)
        try:
            raw.setblocking(False)
            await loop.sock_connect(raw, address)
        except OSError as exc:
            raw.close()
            last = exc
            continue
        except BaseException:
            raw.close()
            raise
        return await _wrap_client(loop, raw, protocol_factory, ssl_context, server_hostname or host)
    raise last or OSError(f"cannot resolve {host}:{port}")


async def _wrap_client(loop: asyncio.AbstractEventLoop, raw: socket.socket, protocol_factory: Callable[[], P],
                       context: ssl.SSLContext, server_hostname: str) -> tuple[TlsSocketTransport, P]:
    if raw.family in (socket.AF_INET, socket.AF_INET6):
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        enable_read_ahead(context)
        sock = context.wrap_socket(raw, server_hostname=server_hostname, do_handshake_on_connect=False)
    except BaseException:
        raw.close()
        raise
    try:
        await handshake(loop, sock)
    except BaseException:
        sock.close()
        raise
    protocol = protocol_factory()
    return TlsSocketTransport(loop, sock, protocol, context), protocol
