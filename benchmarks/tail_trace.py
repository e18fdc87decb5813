"""Probe instrumentation (not a benchmark, not imported by the library): timestamps of
every hop of the tail path, in every process of a probe run.

``install(role)`` wraps, by replacing class attributes, the points a tailed entry
passes (``CLOCK_MONOTONIC`` is machine-wide, so times of different processes compare):

- client, writing: ``lappend`` (the ledger writer packed entry N, with the LAC it
  carries), ``send`` (a run of adds taken into a message to a bookie, both wires),
  ``ack`` (a bookie's answer read), ``confirm`` (``LedgerWriter._complete``), ``push``
  and ``pushed`` (the explicit LAC push to one bookie: started, answered);
- bookie: ``arrive`` (a binary ADD frame dispatched), ``adds`` / ``added`` (the service's
  ``answer_adds``: started, answered — journal and fdatasync inside), ``sync`` (each
  fdatasync's duration), ``wlac`` (an explicit LAC received), ``poll`` / ``polled``
  (a long poll: started, answered with its LAC and number of entries);
- client, reading: ``lp`` / ``lpd`` (a long poll sent / its answer back).

Every process dumps its events at exit to ``$SCRIBA_TAIL_TRACE/<role>-<pid>.json``.
Bookie processes install it from a ``sitecustomize`` on ``PYTHONPATH`` (see
``probe_tail.py``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EVENTS: list[tuple[Any, ...]] = []
_now = time.monotonic_ns


def note(*event: Any) -> None:
    EVENTS.append((_now(), *event))


def _dump(path: Path) -> None:
    path.write_text(json.dumps(EVENTS))


def traced_env(base: Path, site_code: str) -> tuple[dict[str, str], Path]:
    """A ``sitecustomize`` (``site_code``) under ``base`` and a trace folder: the environment
    that makes a child process (a bookie) install its tracing, and where traces go."""
    site = base / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(site_code)
    trace = base / "trace"
    trace.mkdir()
    return {"PYTHONPATH": str(site), "SCRIBA_TAIL_TRACE": str(trace)}, trace


def install(role: str, out_dir: str | None = None) -> None:
    out = out_dir or os.environ.get("SCRIBA_TAIL_TRACE")
    if not out:
        return
    name = role
    if "--id" in sys.argv:
        name = f"{role}-{sys.argv[sys.argv.index('--id') + 1]}"
    atexit.register(_dump, Path(out) / f"{name}-{os.getpid()}.json")
    if role == "bookie":
        _bookie()
    else:
        _client()


def _wrap_async(cls: type, name: str, before: Any, after: Any) -> None:
    """An ``async def`` wrapper (gRPC's server tells coroutine functions by their kind)."""
    orig = getattr(cls, name)

    @functools.wraps(orig)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = before(*args, **kwargs)
        result = await orig(*args, **kwargs)
        after(token, result, *args, **kwargs)
        return result

    setattr(cls, name, wrapper)


def _wrap_sync(cls: type, name: str, before: Any) -> None:
    orig = getattr(cls, name)

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before(*args, **kwargs)
        return orig(*args, **kwargs)

    setattr(cls, name, wrapper)


def _client() -> None:
    from scriba.client.add_batcher import BookieAdds
    from scriba.client.grpc_transport import GrpcBookieTransport
    from scriba.client.writer import LedgerWriter

    orig_register = BookieAdds._register

    def register(self: Any, run: Any) -> None:
        note("send", run.ledger_id, run.entry_ids[0], run.entry_ids[-1])
        orig_register(self, run)

    BookieAdds._register = register  # type: ignore[method-assign]

    _wrap_sync(GrpcBookieTransport, "_on_answer",
               lambda self, conn, lid, ids, code: note("ack", conn.bookie_id, lid, ids[0], ids[-1]))
    _wrap_sync(LedgerWriter, "_complete",
               lambda self, effect: note("confirm", self._ledger_id, effect.first, effect.last))

    orig_append = LedgerWriter.append_async

    def append_async(self: Any, payload: Any) -> Any:
        lac = self._core.last_add_confirmed
        fut = orig_append(self, payload)
        note("lappend", self._ledger_id, self._core.next_entry_id - 1, lac)
        return fut

    LedgerWriter.append_async = append_async  # type: ignore[method-assign]

    _wrap_async(LedgerWriter, "_push_lac", lambda self, bookie_id, lac: note("push", self._ledger_id, lac),
                lambda *a, **k: None)
    _wrap_async(LedgerWriter, "_write_lac", lambda self, bookie_id, lac: None,
                lambda token, result, self, bookie_id, lac: note("pushed", bookie_id, self._ledger_id, lac))

    def lp_before(self: Any, bookie_id: Any, ledger_id: Any, previous_lac: Any, **kw: Any) -> Any:
        note("lp", bookie_id, ledger_id, previous_lac)

    def lp_after(token: Any, result: Any, self: Any, bookie_id: Any, ledger_id: Any, previous_lac: Any,
                 **kw: Any) -> None:
        note("lpd", bookie_id, ledger_id, previous_lac, int(result.lac), len(result.piggybacked_entries))

    from scriba.client.binary_transport import BinaryTransport

    for cls in (GrpcBookieTransport, BinaryTransport):
        _wrap_async(cls, "long_poll_lac", lp_before, lp_after)


def _bookie() -> None:
    from scriba.bookie.binary_server import BinaryConnection
    from scriba.bookie.fileio import OsFileIO
    from scriba.bookie.service import BookieService

    orig_add = BinaryConnection._add

    def add(self: Any, rid: int, runs: Any) -> Any:
        for run in runs:
            note("arrive", run.ledger_id, run.entry_ids[0], run.entry_ids[-1])
        return orig_add(self, rid, runs)

    BinaryConnection._add = add  # type: ignore[method-assign]

    def adds_before(self: Any, adds: Any, runs: Any, conn: Any) -> Any:
        spans = [(r.ledger_id, r.entry_ids[0], r.entry_ids[-1]) for r in runs if len(r.entry_ids)]
        for span in spans:
            note("adds", *span)
        return spans

    def adds_after(spans: Any, result: Any, *args: Any) -> None:
        for span in spans:
            note("added", *span)

    _wrap_async(BookieService, "answer_adds", adds_before, adds_after)

    orig_sync = OsFileIO.fdatasync

    def fdatasync(self: Any, fd: int) -> None:
        t0 = _now()
        orig_sync(self, fd)
        note("sync", (_now() - t0) / 1e6)

    OsFileIO.fdatasync = fdatasync  # type: ignore[method-assign]

    _wrap_async(BookieService, "WriteLac",
                lambda self, request, context: note("wlac", request.ledger_id, request.lac),
                lambda *a, **k: None)

    def poll_before(self: Any, request: Any, context: Any) -> Any:
        if request.long_poll:
            note("poll", request.ledger_id, request.previous_lac)
        return request.long_poll

    def poll_after(long_poll: Any, response: Any, self: Any, request: Any, context: Any) -> None:
        if long_poll:
            note("polled", request.ledger_id, request.previous_lac, response.lac,
                 len(response.piggybacked_entries))

    _wrap_async(BookieService, "ReadLac", poll_before, poll_after)
