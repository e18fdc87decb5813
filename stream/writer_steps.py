"""Carrying out a stream writer's steps, and taking its writer lock.

:class:`~scriba.stream.writer_core.WriterCore`'s opening, adoption and roll rules are
generators of steps (``writer_core.open_steps``, ``adopt_steps``, ``add_segment_steps``):
each yields a frozen step (``UpdateStream``, ``RecoverSegment``, ``DeleteLedgers``,
``CreateLedger``, ``DiscardLedger``) and is sent its result. :class:`StepRunner` performs
them over the ledger client and the catalog; a step's error is thrown back into the
generator, which decides (and re-raises). Ledgers it creates are kept in ``created``
until the stream record names them (``take``) or a step discards them, so an abort can
abort them too.

The writer lock (:func:`take_lock`) is an :class:`~scriba.meta.election.Election`
campaign bounded by ``lock_timeout_s``; its token fences the stream. A campaign given
up on (timed out or cancelled) deletes its own claim, should its create have landed
just before (:func:`drop_claim`), so no claim holds the lock for nobody.

Used by ``stream.writer`` (opening a writer, adopting ledgers, a roll's new segment);
off the append path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Generator
from typing import Any, TypeVar

from scriba.client import Client, LedgerWriter
from scriba.errors import NoSuchKeyError, ScribaError, WriterLockedError
from scriba.invariant import invariant
from scriba.log import get_logger
from scriba.meta.election import Election, Leadership
from scriba.stream.catalog import Catalog
from scriba.stream.ledgers import create_segment_ledger, delete_ledgers, recover_segment
from scriba.stream.settings import StreamSettings
from scriba.stream.writer_core import (
    CreateLedger,
    DeleteLedgers,
    DiscardLedger,
    RecoverSegment,
    Step,
    UpdateStream,
)

log = get_logger(__name__)
R = TypeVar("R")

__all__ = ["StepRunner", "candidate_name", "drop_claim", "take_lock"]


class StepRunner:
    """Performs the opening and roll steps (``writer_core.Step``) over the client and the store."""

    def __init__(self, client: Client, catalog: Catalog, name: str, settings: StreamSettings, password: bytes) -> None:
        self._client = client
        self._catalog = catalog
        self._name = name
        self._settings = settings
        self._password = password
        self.created: dict[int, LedgerWriter] = {}  # ledgers created, not yet taken or discarded

    async def run(self, steps: Generator[Step, Any, R]) -> R:
        """Drive ``steps`` to their return value; a step's error is thrown into them."""
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(result) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                result, error = await self._perform(step), None
            except BaseException as exc:  # thrown into the steps, which re-raise it
                result, error = None, exc

    def take(self, record: Any, seq: int) -> LedgerWriter:
        """The created ledger of segment ``seq`` (now in the stream record)."""
        segment = record.segment(seq)
        invariant(segment is not None and segment.ledger_id in self.created, f"segment {seq}: no ledger created")
        return self.created.pop(segment.ledger_id)

    async def _perform(self, step: Step) -> Any:
        name = self._name
        catalog = self._catalog
        if isinstance(step, UpdateStream):
            return await catalog.update_stream(name, step.needs_update, step.transform)
        if isinstance(step, RecoverSegment):
            summary = await recover_segment(self._client, step.segment, self._password)
            log.info("stream_segment_recovered", stream=f"{catalog.namespace}/{name}", segment=step.segment.seq,
                     records=summary.record_count)
            return summary
        if isinstance(step, DeleteLedgers):
            return await delete_ledgers(self._client, step.ledger_ids)
        if isinstance(step, CreateLedger):
            ledger = await create_segment_ledger(
                self._client, self._settings, self._password, namespace=catalog.namespace, stream=name
            )
            self.created[int(ledger.ledger_id)] = ledger
            return int(ledger.ledger_id)
        if isinstance(step, DiscardLedger):
            discarded = self.created.pop(step.ledger_id, None)
            if discarded is not None:
                await discarded.abort()
            if step.delete:
                with contextlib.suppress(ScribaError):
                    await delete_ledgers(self._client, (step.ledger_id,))
            return None
        invariant(False, f"unknown stream writer step {step!r}")
        return None


# --- the writer lock --------------------------------------------------------------------
def candidate_name() -> str:
    """This process's name in the election: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def take_lock(election: Election, candidate: str, timeout_s: float) -> Leadership:
    try:
        async with asyncio.timeout(timeout_s):
            return await election.campaign(candidate)
    except TimeoutError:
        await drop_claim(election, candidate)
        holder = await election.leader()
        raise WriterLockedError(
            f"writer lock {election.name} held by {holder[0] if holder else 'someone'}; "
            f"not free within {timeout_s} s"
        ) from None
    except asyncio.CancelledError:
        await drop_claim(election, candidate)
        raise


async def drop_claim(election: Election, candidate: str) -> None:
    """A campaign given up on: a claim whose create landed just before would hold the
    lock for nobody until the session ends, so delete it if it is ours."""
    with contextlib.suppress(ScribaError, NoSuchKeyError):
        leader = await election.leader()
        if leader is not None and leader[0] == candidate:
            record = await election.store.get(election.key)
            await election.store.delete(election.key, expected_version=record.version)
