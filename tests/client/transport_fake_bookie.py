"""A small in-process bookie servicer for transport tests (grpc.aio, in memory).

Knobs: ``add_delay_s`` (answer batches late), ``silent`` (swallow adds: a
blackhole), ``status_for`` (force a status per entry), ``fenced`` ledgers,
``split_answers`` (answer a run in two parts, ids in reverse order), ``range_chunks``
(a canned ReadRange answer). Adds sent in runs are answered in runs, one answer per run
and status. Range reads are answered in ``entries``, as by a bookie that predates
``packed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from scriba.proto import scriba_pb2 as pb
from scriba.proto import scriba_pb2_grpc as pb_grpc


class FakeBookie(pb_grpc.BookieServicer):
    def __init__(self, bookie_id: str = "fake") -> None:
        self.bookie_id = bookie_id
        self.entries: dict[tuple[int, int], bytes] = {}
        self.keys: dict[int, bytes] = {}
        self.fenced: set[int] = set()
        self.add_delay_s = 0.0
        self.silent = False
        self.status_for: Callable[[int, int], int] | None = None
        self.batches_received = 0
        self.batch_sizes: list[int] = []
        self.streams_opened = 0
        self.lac: dict[int, int] = {}
        self.run_entry_ids: list[list[int]] = []  # entry ids of every run received
        self.split_answers = False  # answer each run in two parts, out of order
        self.range_requests: list[Any] = []  # every ReadRangeRequest received
        self.range_chunks: list[Any] | None = None  # canned ReadRange answer (else from entries)

    def _add_one(self, a: Any) -> pb.AddResponse:
        if self.status_for is not None:
            code = self.status_for(a.ledger_id, a.entry_id)
            if code:
                return pb.AddResponse(ledger_id=a.ledger_id, entry_id=a.entry_id, status=code, message="forced")
        key = self.keys.setdefault(a.ledger_id, a.master_key)
        if key != a.master_key:
            return pb.AddResponse(ledger_id=a.ledger_id, entry_id=a.entry_id, status=pb.UNAUTHORIZED, message="key")
        if a.ledger_id in self.fenced and not a.flags & pb.RECOVERY_ADD:
            return pb.AddResponse(ledger_id=a.ledger_id, entry_id=a.entry_id, status=pb.FENCED)
        self.entries.setdefault((a.ledger_id, a.entry_id), bytes(a.entry))
        return pb.AddResponse(ledger_id=a.ledger_id, entry_id=a.entry_id, status=pb.OK)

    def _add_run(self, run: Any) -> list[pb.AddRunResponse]:
        """A run's adds one by one (as ``_add_one``), answered per status in add order."""
        if len(run.sizes) != len(run.entry_ids) or sum(run.sizes) != len(run.entries):
            return [pb.AddRunResponse(ledger_id=run.ledger_id, entry_ids=run.entry_ids, status=pb.BAD_REQUEST)]
        self.run_entry_ids.append(list(run.entry_ids))
        groups: dict[int, list[int]] = {}
        offset = 0
        for entry_id, size in zip(run.entry_ids, run.sizes, strict=True):
            add = pb.AddRequest(
                ledger_id=run.ledger_id, entry_id=entry_id, master_key=run.master_key, flags=run.flags,
                entry=run.entries[offset : offset + size],
            )
            offset += size
            groups.setdefault(self._add_one(add).status, []).append(entry_id)
        return [
            pb.AddRunResponse(ledger_id=run.ledger_id, entry_ids=ids, status=status)  # type: ignore[arg-type]
            for status, ids in groups.items()
        ]

    async def AddStream(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        self.streams_opened += 1
        async for batch in request_iterator:
            self.batches_received += 1
            self.batch_sizes.append(len(batch.adds) + sum(len(r.entry_ids) for r in batch.runs))
            if self.silent:
                continue
            if self.add_delay_s:
                await asyncio.sleep(self.add_delay_s)
            answers = [a for run in batch.runs for a in self._add_run(run)]
            if self.split_answers:  # each answer as two, the later half first, ids reversed
                split = []
                for a in answers:
                    ids = list(a.entry_ids)[::-1]
                    half = len(ids) // 2
                    for part in (ids[:half], ids[half:]):
                        if part:
                            split.append(pb.AddRunResponse(ledger_id=a.ledger_id, entry_ids=part, status=a.status))
                answers = split
            yield pb.AddResponseBatch(responses=[self._add_one(a) for a in batch.adds], runs=answers)

    async def ReadEntry(self, request: Any, context: Any) -> Any:
        if self.silent:
            await asyncio.sleep(3600)  # the stand-in never answers
        if request.flags & pb.FENCE:
            self.fenced.add(request.ledger_id)
        if request.ledger_id not in self.keys:
            return pb.ReadEntryResponse(status=pb.NO_SUCH_LEDGER, message="no ledger")
        data = self.entries.get((request.ledger_id, request.entry_id))
        if data is None:
            return pb.ReadEntryResponse(status=pb.NO_SUCH_ENTRY, message="no entry")
        return pb.ReadEntryResponse(
            status=pb.OK, ledger_id=request.ledger_id, entry_id=request.entry_id, entry=data
        )

    async def ReadRange(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Answers in ``entries`` only, as a bookie that predates ``packed`` (or ``range_chunks``)."""
        self.range_requests.append(request)
        if self.range_chunks is not None:
            for chunk in self.range_chunks:
                yield chunk
            return
        if request.ledger_id not in self.keys:
            yield pb.ReadRangeResponse(status=pb.NO_SUCH_LEDGER)
            return
        chunk: list[bytes] = []
        first = request.first_entry_id
        for e in range(request.first_entry_id, request.last_entry_id + 1):
            data = self.entries.get((request.ledger_id, e))
            if data is None:
                yield pb.ReadRangeResponse(status=pb.NO_SUCH_ENTRY, first_entry_id=first, entries=chunk)
                return
            chunk.append(data)
            if len(chunk) == 3:  # small chunks so the client joins several
                yield pb.ReadRangeResponse(status=pb.OK, first_entry_id=first, entries=chunk)
                first, chunk = e + 1, []
        if chunk:
            yield pb.ReadRangeResponse(status=pb.OK, first_entry_id=first, entries=chunk)

    async def ReadLac(self, request: Any, context: Any) -> Any:
        if request.flags & pb.FENCE:
            self.fenced.add(request.ledger_id)
            self.keys.setdefault(request.ledger_id, request.master_key)
        if request.long_poll:
            deadline = asyncio.get_running_loop().time() + request.timeout_ms / 1000
            while self.lac.get(request.ledger_id, -1) <= request.previous_lac:
                if asyncio.get_running_loop().time() >= deadline:
                    break
                await asyncio.sleep(0.01)  # the stand-in bookie's own long poll (program under test's peer)
        ids = [e for (lid, e) in self.entries if lid == request.ledger_id]
        last = max(ids, default=-1)
        return pb.ReadLacResponse(
            status=pb.OK,
            lac=self.lac.get(request.ledger_id, -1),
            last_entry_id=last,
            last_entry=self.entries.get((request.ledger_id, last), b""),
            fenced=request.ledger_id in self.fenced,
        )

    async def WriteLac(self, request: Any, context: Any) -> Any:
        if self.keys.get(request.ledger_id, request.master_key) != request.master_key:
            return pb.WriteLacResponse(status=pb.UNAUTHORIZED, message="key")
        self.lac[request.ledger_id] = max(self.lac.get(request.ledger_id, -1), request.lac)
        return pb.WriteLacResponse(status=pb.OK)

    async def GetBookieInfo(self, request: Any, context: Any) -> Any:
        return pb.BookieInfoResponse(
            status=pb.OK, bookie_id=self.bookie_id, state=pb.BOOKIE_READ_WRITE, free_bytes=10, total_bytes=20
        )


class FakeBookieServer:
    """``async with FakeBookieServer() as s``: ``s.address``, ``s.servicer``; stop/start keeps the port."""

    def __init__(self, servicer: FakeBookie | None = None, port: int = 0) -> None:
        self.servicer = servicer or FakeBookie()
        self.port = port
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.so_reuseport", 0)]
        )
        pb_grpc.add_BookieServicer_to_server(self.servicer, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> FakeBookieServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
