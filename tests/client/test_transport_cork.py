"""When the binary transport sends the appends made while answers are processed.

A writer calls back its appends' owners while it processes a confirmation, and those
callbacks append again (one append in flight: the next append is made right there).
Those appends are held (``cork``) until the processing ends (``uncork``) and then
leave at once, in one message per bookie, without waiting for a loop turn:

- a bookie that still has a message unanswered gets them at ``uncork`` too (its sender
  task would send the same message one loop turn later: at one append in flight, the
  bookie that was slowest on the last entry got the next one last);
- the appends made by the callbacks of one ADD_ACK frame (every ledger it answers)
  leave together: one message per bookie, not one per ledger.

A fake binary bookie records the ADD frames and answers when the test says.
"""

from __future__ import annotations

import asyncio
from typing import Any

from scriba.client.binary_transport import BinaryTransport
from scriba.client.transport import TransportConfig
from scriba.entry import Crc32cDigest, master_key, pack_entry
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.proto import binary as wire

KEY = master_key(b"pw")
BOOKIE = BookieId("fake")


class FakeBookie:
    """A binary bookie that records each ADD frame as ``[(ledger_id, entry_ids), ...]``
    and answers one only when ``answer`` is called."""

    def __init__(self) -> None:
        self.adds: list[tuple[int, list[tuple[int, list[int]]]]] = []  # (request id, runs)
        self.arrived = asyncio.Condition()
        self._writer: asyncio.StreamWriter | None = None
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        await reader.readexactly(wire.HEADER_SIZE + 2)  # HELLO
        writer.write(b"".join(bytes(p) for p in wire.encode_hello_ok(0, wire.VERSION)))
        frames = wire.FrameReader()
        while chunk := await reader.read(65536):
            for header, body in frames.feed(chunk):
                if header.type == wire.FrameType.ADD:
                    runs = [(r.ledger_id, list(r.entry_ids)) for r in wire.decode_add(body)]
                    async with self.arrived:
                        self.adds.append((header.request_id, runs))
                        self.arrived.notify_all()

    async def wait_adds(self, count: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.adds) >= count), 20)

    def answer(self, request_id: int, runs: list[tuple[int, list[int]]]) -> None:
        """One ADD_ACK frame answering ``runs`` OK."""
        assert self._writer is not None
        answers = [(lid, ids, 0, "") for lid, ids in runs]
        self._writer.write(b"".join(bytes(p) for p in wire.encode_add_ack(request_id, answers)))


def _entry(ledger_id: int, entry_id: int) -> bytes:
    return pack_entry(Crc32cDigest(), ledger_id, entry_id, entry_id - 1, 0, b"x" * 100)


async def _transport(bookie: FakeBookie) -> BinaryTransport:
    address = await bookie.start()
    return BinaryTransport(lambda _: "127.0.0.1:1", TransportConfig(add_timeout_s=30),
                           resolve_binary=lambda _: address)


def _ignore(*_: Any) -> None:
    pass


async def test_uncork_sends_to_a_bookie_with_a_message_unanswered_before_returning() -> None:
    bookie = FakeBookie()
    t = await _transport(bookie)
    try:
        t.add_entry((BOOKIE,), LedgerId(7), EntryId(0), KEY, _entry(7, 0), _ignore)
        await bookie.wait_adds(1)  # unanswered: the bookie is busy
        sent = t.batches_sent
        t.cork()
        t.add_entry((BOOKIE,), LedgerId(7), EntryId(1), KEY, _entry(7, 1), _ignore)
        t.add_entry((BOOKIE,), LedgerId(7), EntryId(2), KEY, _entry(7, 2), _ignore)
        assert t.batches_sent == sent, "held while corked"
        t.uncork()
        assert t.batches_sent == sent + 1, "sent by uncork itself, not by the sender task a loop turn later"
        await bookie.wait_adds(2)
        assert bookie.adds[1][1] == [(7, [1, 2])]  # both appends, one message
    finally:
        await t.close()
        await bookie.stop()


async def test_the_appends_made_by_one_answer_frames_callbacks_leave_in_one_message() -> None:
    """Two ledgers answered by one ADD_ACK; each one's callback appends its next entry
    (corked, as a writer does): the bookie gets both in one ADD frame."""
    bookie = FakeBookie()
    t = await _transport(bookie)
    answered: list[int] = []

    def next_entry(_bookie: BookieId, ledger_id: int, entry_ids: list[int], status: Any) -> None:
        answered.append(ledger_id)
        if entry_ids == [0]:
            t.cork()
            try:
                t.add_entry((BOOKIE,), LedgerId(ledger_id), EntryId(1), KEY, _entry(ledger_id, 1), next_entry)
            finally:
                t.uncork()

    try:
        t.add_entry((BOOKIE,), LedgerId(1), EntryId(0), KEY, _entry(1, 0), next_entry)
        t.add_entry((BOOKIE,), LedgerId(2), EntryId(0), KEY, _entry(2, 0), next_entry)
        await bookie.wait_adds(1)
        rid, runs = bookie.adds[0]
        assert runs == [(1, [0]), (2, [0])]  # made in one loop turn: one message
        bookie.answer(rid, runs)
        await bookie.wait_adds(2)
        assert answered == [1, 2]
        # the answer frame was handled whole before its appends left: nothing else went
        assert t.batches_sent == 2, "one message for both ledgers"
        assert bookie.adds[1][1] == [(1, [1]), (2, [1])]
    finally:
        await t.close()
        await bookie.stop()
