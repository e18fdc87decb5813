"""The in-process stream site the ``test_stream_*`` files of the public API share.

Fast stand-ins for real processes (those run in ``test_stream_processes.py``):
``scriba.testing.sim.InProcessSite`` (in-memory bookie storage per bookie) and a
``memory://`` store; each "process" is its own Client on its own store session
(``env.client()``; ``crash()`` ends its session uncleanly). The ``env`` fixture is in
this folder's ``conftest.py``; here: the site's bookies and client configuration, the
namespace every test opens, and the readers' helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scriba.client import ClientConfig
from scriba.client.driver import DriverConfig
from scriba.stream import Namespace, Position, Record, WriterOptions, open_namespace
from scriba.stream.segments import SegmentState
from scriba.testing.sim import InProcessSite

BOOKIES = [f"bk{i}" for i in range(4)]
CONFIG = ClientConfig(
    add_timeout_s=2.0, bookie_wait_s=2.0,
    driver=DriverConfig(read_timeout_s=2.0, metadata_timeout_s=5.0, long_poll_s=0.2),
)
FAST_LOCK = WriterOptions(lock_timeout_s=0.5)


Env = InProcessSite  # each client() is a "process"; crash() ends its session uncleanly


async def open_ns(env: Env, **settings: Any) -> Namespace:
    client = await env.client()
    return await open_namespace(client, "prod/payments", create=True, ensemble_size=3,
                                write_quorum_size=3, ack_quorum_size=2, **settings)


async def read_all(ns: Namespace, name: str, start: Any = "earliest") -> list[Record]:
    """Every record from ``start`` to the end of a stream whose last segment is closed."""
    info = await ns.info(name)
    last = info.record.last_segment
    assert last is not None and last.state is SegmentState.CLOSED, "read_all needs a closed stream"
    ends = [s.last_position for s in info.record.segments if s.last_position is not None]
    final = ends[-1] if ends else None
    out: list[Record] = []
    reader = await ns.open_reader(name, start)
    try:
        while final is not None and (not out or out[-1].position < final):
            rec = await reader.read_next(timeout_s=5.0)
            if rec is None:
                break
            out.append(rec)
        assert await reader.read_next(timeout_s=0.02) is None
    finally:
        await reader.close()
    assert all(r.position < last.end for r in out)
    return out


def current_ledger(writer: Any) -> Any:
    """The ledger of the segment a writer writes (to make it die mid-stream, as a crash does)."""
    return writer._ledgers[writer.segment_seq]


def pairs(records: Sequence[Record]) -> list[tuple[Position, bytes]]:
    return [(r.position, r.payload) for r in records]


