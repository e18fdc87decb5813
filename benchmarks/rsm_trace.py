"""Probe instrumentation (not a benchmark, not imported by the library): timestamps of
every hop of one RSM proposal, in the replica processes and the driving client
(``probe_rsm.py``). Events go to ``tail_trace.EVENTS`` (``CLOCK_MONOTONIC``, machine-wide)
and are dumped like ``tail_trace``'s; the ledger writer's and the bookies' hops are
``tail_trace``'s own (``lappend``, ``send``, ``ack``, ``confirm``; ``arrive``, ``adds``,
``added``, ``sync``).

Replica (leader) hops, in the order a proposal passes them:

- ``srv_in``: the request frame read off the socket (``wire.parse_request``);
- ``h0``: its handler task running (``ReplicaService._handle``);
- ``propose``: queued in the term's batcher (``LeaderTerm.propose``);
- ``flush``: the batcher flushed (``LeaderTerm.flush``, a ``call_soon`` later);
- ``append``: the batch's append task running (``LeaderTerm._append``);
- ``sflush`` / ``sflushed``: the stream writer's flush (``StreamWriter._flush``, a
  ``call_soon`` later; the adds leave for the bookies inside it);
- ``lappend`` .. ``confirm``: the ledger (``tail_trace``);
- ``sent``: the stream writer told (``StreamWriter._on_sent``);
- ``apply0`` / ``apply1``: the term's confirm callback (apply and answer the futures);
- ``sub1``: the proposal's ``_submit`` resumed with its outcome;
- ``srv_out``: the answer encoded and written (``wire.ok``).

These events carry the main thread's CPU time (ns) as their last field, so the
leader's CPU spent on a proposal's critical path can be told from its wall time.
Every process also notes ``gc`` (generation, duration in ms) from ``gc.callbacks``.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from typing import Any

import tail_trace
from tail_trace import _now, _wrap_async, note


def _gc_hooks() -> None:
    started = [0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = _now()
        else:
            note("gc", info.get("generation", -1), (_now() - started[0]) / 1e6, info.get("collected", 0))

    gc.callbacks.append(callback)


def note_cpu(kind: str) -> None:
    """An event with this thread's CPU time (ns) as its last field."""
    note(kind, time.thread_time_ns())


def _wrap_sync(cls: Any, name: str, before: str | None, after: str | None = None) -> None:
    orig = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            note_cpu(before)
        result = orig(*args, **kwargs)
        if after:
            note_cpu(after)
        return result

    setattr(cls, name, wrapper)


def install_replica(out_dir: str) -> None:
    """The ledger writer's hooks (``tail_trace``) plus the replica's; dump on SIGTERM."""
    from pathlib import Path

    from scriba.rsm import wire
    from scriba.rsm.replica import ReplicatedStateMachine
    from scriba.rsm.term import LeaderTerm
    from scriba.stream.writer import StreamWriter

    tail_trace._client()
    _gc_hooks()
    _wrap_sync(wire, "parse_request", "srv_in")
    _wrap_sync(wire, "ok", "srv_out")
    _wrap_async(ReplicatedStateMachine, "_handle", lambda *a, **k: note_cpu("h0"), lambda *a, **k: None)
    _wrap_async(ReplicatedStateMachine, "_submit", lambda *a, **k: None, lambda *a, **k: note_cpu("sub1"))
    _wrap_sync(ReplicatedStateMachine, "_confirm", "apply0", "apply1")
    _wrap_sync(LeaderTerm, "propose", "propose")
    _wrap_sync(LeaderTerm, "flush", "flush")
    _wrap_async(LeaderTerm, "_append", lambda *a, **k: note_cpu("append"), lambda *a, **k: None)
    _wrap_sync(StreamWriter, "_flush", "sflush", "sflushed")
    _wrap_sync(StreamWriter, "_on_sent", "sent")
    path = Path(out_dir) / f"replica-{os.getpid()}.json"

    def dump(*_: Any) -> None:
        tail_trace._dump(path)
        os._exit(0)

    signal.signal(signal.SIGTERM, dump)


def install_bookie() -> None:
    tail_trace.install("bookie")
    if os.environ.get("SCRIBA_TAIL_TRACE"):
        _gc_hooks()


def install_client() -> None:
    """The driving client: ``cresp`` when an answer frame is parsed, and its GC."""
    from scriba.rsm import wire

    _gc_hooks()
    _wrap_sync(wire, "parse_response", "cresp")


if __name__ == "__main__":
    sys.exit("a module of probe_rsm.py")
