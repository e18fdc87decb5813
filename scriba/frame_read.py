"""How the binary data path takes bytes from an asyncio transport (client links and bookie
connections alike): into one reused buffer per thread, not into a fresh one per read.

Why: a plain ``asyncio.Protocol`` gets each read as a new ``bytes`` that the loop
allocated at the transport's maximum read size (256 KiB) and then shrank to what
arrived. Until something raises glibc's dynamic mmap threshold (128 KiB at start), that
size is served by ``mmap``: every read then costs an ``mmap``, a page fault, an
``mremap`` and a ``munmap`` (16 us per read of a 1 KiB message against 2.4 us for
``recv_into`` a reused buffer, a socket pair in a fresh process; a loopback echo served
by a ``BufferedProtocol`` took 35 us of CPU per round trip against 48 us). Once the
threshold is raised it is a 256 KiB heap allocation and a shrink per read, cheaper but
still not free. Over TLS asyncio's ``sslproto`` does the same with
``SSLObject.read(256 KiB)``, once per TLS record. At one add in flight each bookie reads
once per add, the writer once per answer and a tailing reader once per entry.

So the connections are ``asyncio.BufferedProtocol``s: the loop (and, over TLS,
``scriba.tls_socket``, several records per call, or ``sslproto``) reads
into :func:`read_buffer`, a buffer of ``READ_BUFFER_BYTES`` kept per thread, and
``buffer_updated`` hands a ``bytes`` copy of exactly what arrived to the protocol's
``data_received``, as before. Frames keep their contract (a body is a view of an
immutable ``bytes``). One buffer per thread is enough: a read fills it and is copied out
in one synchronous step of the loop (``get_buffer`` -> ``recv_into`` / ``SSLObject.read``
-> ``buffer_updated``), so no two reads ever hold it at once, and a process with
thousands of connections keeps one buffer, not thousands.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Final

READ_BUFFER_BYTES: Final = 256 * 1024  # what asyncio's transports read at most at once

_local = threading.local()


def read_buffer() -> memoryview:
    """This thread's read buffer (allocated on first use)."""
    view: memoryview | None = getattr(_local, "view", None)
    if view is None:
        view = _local.view = memoryview(bytearray(READ_BUFFER_BYTES))
    return view


class BufferedFrames(asyncio.BufferedProtocol):
    """A protocol whose reads land in :func:`read_buffer`; subclasses implement
    ``data_received(data: bytes)`` as a plain ``asyncio.Protocol`` would."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        # The same thread's buffer that get_buffer gave, in the same step of the loop.
        self.data_received(bytes(read_buffer()[:nbytes]))

    def data_received(self, data: bytes) -> None:
        raise NotImplementedError
