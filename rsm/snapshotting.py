"""Snapshots of a replica: taken automatically (the schedule) or on demand from a
point-in-time copy while apply continues, stored chunked by ``snapshot_store``; and the
restore of the newest usable one when starting or when the stream is truncated past the
applied position (a mixin of ``ReplicatedStateMachine``; its methods run on the replica).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from scriba.errors import ReplicaStoppedError, ScribaError, SnapshotCorruptError, StateMachineError
from scriba.rsm import membership as mb
from scriba.rsm.snapshot_store import load_newest, store_snapshot
from scriba.stream import Position

if TYPE_CHECKING:
    from scriba.rsm.replica import ReplicatedStateMachine


class Snapshotting:
    def take_snapshot(self: ReplicatedStateMachine) -> asyncio.Task[None] | None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """Start a snapshot now (point-in-time copy taken before this returns); None if one runs."""
        if self.schedule.running or self.state.applied is None or self._ns is None:
            self.schedule.on_demand()
            return None
        self.schedule.started()
        chunks = self.state.snapshot(self.config.snapshot_chunk_bytes)
        position, records, token = self.state.applied, self.state.records_applied, self.state.token
        self._snapshot_task = self._spawn(self._store_snapshot(chunks, position, records, token))
        return self._snapshot_task

    async def _store_snapshot(self: ReplicatedStateMachine, chunks: list[bytes], position: Position, records: int, token: int) -> None:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        assert self._ns is not None
        try:
            self.snapshot_info = await store_snapshot(
                self._ns, self.name, mb.catalog_key(self.group), chunks, position, records, token,
                self.config.snapshots_kept, self._password,
            )
            self.schedule.finished(position)
        except ScribaError as exc:
            self._log.warning("rsm_snapshot_failed", error=str(exc))
            self.schedule.finished(None)

    async def snapshot(self: ReplicatedStateMachine) -> Position:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """Take a snapshot now and wait until it is stored; its position."""
        self._check_running()
        while self._snapshot_task is not None and not self._snapshot_task.done():
            await asyncio.shield(self._snapshot_task)
        task = self.take_snapshot()
        if task is None:
            raise ReplicaStoppedError("nothing applied yet: no snapshot to take")
        await task
        if self.schedule.last_position is None:
            raise SnapshotCorruptError("the snapshot could not be stored (see the log)")
        return self.schedule.last_position


    async def _restore_newer(self: ReplicatedStateMachine) -> bool:  # type: ignore[misc]  # a mixin method of ReplicatedStateMachine
        """Restore the newest usable snapshot if it is ahead of the applied position."""
        found = await load_newest(self.client, mb.catalog_key(self.group), self.state.applied, self._password)
        if found is None:
            return False
        info, chunks = found
        try:
            self.state.restore(chunks)
        except StateMachineError as exc:
            self._fatal(exc)
            raise
        self.role.restored_to(info.position)
        self.schedule.restored(info.position)
        self.snapshot_info = self.restored_from = info
        self._log.info("rsm_snapshot_restored", position=str(info.position), ledger_id=info.ledger_id)
        self._changed.set()
        return True
