"""Is a ledger still unfenced? A writer's cheap check (no add, no journal fsync).

A plain LAC read (``read_lac`` without the fence flag, on gRPC ``ReadLac`` and on the
binary path's ``READ_LAC`` frame alike) answers from the bookie's memory with the
ledger's ``fenced`` flag; nothing is written. :class:`UnfencedProbe` is the rule over
those answers, without I/O: the verdict is **proven** once the slots that answered "not
fenced" hold ``Qa`` slots of one write set of the writer's current ensemble (spanning
``regions_min`` regions: ``scriba.quorum.Quorum.proves_unfenced``), **unproven** once
the slots left could not (a slot answered "fenced", failed, or does not know the
ledger). :func:`prove_unfenced` asks every bookie of the ensemble at once and stops at
the first verdict.

What a proof means. Fencing is complete only when every write set's unfenced slots
could not confirm an entry (``Quorum.covers_every_write_set``), a bookie marks a ledger
fenced before it answers the fencing read and keeps the mark across restarts (journaled),
and a fenced bookie stays fenced. So ``Qa`` not-fenced answers in one write set, each
given after time ``t``, show that no fence of this ledger was complete at ``t`` — the
same thing an add confirmed by ``Qa`` of that write set shows, which is what a barrier
append proved. The caller supplies ``t`` by sending the probe only after the moment it
cares about (an RSM leader: after the reads it serves arrived, ``scriba.rsm.term``).

Which ensemble. The writer's, and only while no ensemble change of its own is being
written (``WriteCore.fence_probe_target``): a recovery marks the record IN_RECOVERY
before fencing its last ensemble, after which no change of the writer's can be written;
so any change the writer wrote is in the ensemble the recovery fences, and a writer
with no change in flight holds that ensemble. A bookie that does not know the ledger
(``NoSuchLedgerError``) is no proof: counted as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Sequence

from scriba.client.transport import BookieTransport, LacResult
from scriba.errors import ScribaError
from scriba.ids import BookieId, LedgerId
from scriba.quorum import Quorum, SlotRegions


class Verdict(enum.Enum):
    PENDING = "pending"
    PROVEN = "proven"  # Qa slots of one write set answered "not fenced"
    UNPROVEN = "unproven"  # the slots left could no longer prove it


class UnfencedProbe:
    """The answers of one probe, slot by slot (each slot's first answer counts)."""

    def __init__(self, quorum: Quorum, regions: SlotRegions | None = None) -> None:
        self.quorum = quorum
        self.regions = regions
        self.not_fenced: set[int] = set()
        self.failed: set[int] = set()  # answered "fenced", failed, or did not know the ledger
        self.fenced = 0  # of the failed: answered "fenced"
        self.verdict = Verdict.PENDING

    def on_answer(self, slot: int, fenced: bool) -> Verdict:
        if self.verdict is not Verdict.PENDING or slot in self.not_fenced or slot in self.failed:
            return self.verdict
        if fenced:
            self.fenced += 1
            return self.on_failure(slot)
        self.not_fenced.add(slot)
        if self.quorum.proves_unfenced(self.not_fenced, self.regions):
            self.verdict = Verdict.PROVEN
        return self.verdict

    def on_failure(self, slot: int) -> Verdict:
        if self.verdict is not Verdict.PENDING or slot in self.not_fenced:
            return self.verdict
        self.failed.add(slot)
        if not self.quorum.can_still_prove_unfenced(self.failed, self.regions):
            self.verdict = Verdict.UNPROVEN
        return self.verdict

    def on_timeout(self) -> Verdict:
        if self.verdict is Verdict.PENDING:
            self.verdict = Verdict.UNPROVEN
        return self.verdict


async def prove_unfenced(
    transport: BookieTransport,
    ledger_id: LedgerId,
    ensemble: Sequence[BookieId],
    quorum: Quorum,
    regions: SlotRegions | None,
    timeout_s: float,
    master_key: bytes = b"",
) -> UnfencedProbe:
    """Ask every bookie of ``ensemble`` whether ``ledger_id`` is fenced (plain LAC reads,
    sent now, with the ledger's ``master_key`` for bookies that guard its reads); return
    the probe at its first verdict, or unproven after ``timeout_s``."""
    probe = UnfencedProbe(quorum, regions)
    asks: dict[asyncio.Task[LacResult], int] = {
        asyncio.ensure_future(transport.read_lac(bookie_id, ledger_id, master_key=master_key, timeout_s=timeout_s)): slot
        for slot, bookie_id in enumerate(ensemble)
    }
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending: set[asyncio.Task[LacResult]] = set(asks)
    try:
        while pending and probe.verdict is Verdict.PENDING:
            done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()),
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            for task in done:
                error = task.exception()
                if error is None:
                    probe.on_answer(asks[task], task.result().fenced)
                elif isinstance(error, ScribaError):
                    probe.on_failure(asks[task])
                else:
                    raise error
        probe.on_timeout()
        return probe
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
