"""``LedgerReader``: the read handle of a ledger (from ``Client.open_ledger``).

Range reads, LAC reads and tailing by long poll, each run as an ``Operation`` of a
read core.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator
from typing import Any

from scriba.client.driver import DriverConfig, read_ledger_metadata
from scriba.client.operation import Operation
from scriba.client.read_core import LacReadCore, ReadConfig, ReadCore, ReadOrder
from scriba.client.transport import BookieTransport
from scriba.entry import Digest, Entry
from scriba.errors import (
    InternalError,
    NoSuchEntryError,
    ScribaError,
)
from scriba.ids import EntryId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import LedgerMetadata
from scriba.meta.store import MetadataStore

log = get_logger(__name__)


class LedgerReader:
    """A read handle (from ``Client.open_ledger``)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        *,
        store: MetadataStore,
        transport: BookieTransport,
        digest: Digest,
        master_key: bytes,
        read_order: ReadOrder,
        config: DriverConfig | None = None,
        read_config: ReadConfig | None = None,
    ) -> None:
        self._md = metadata
        self._store = store
        self._transport = transport
        self._digest = digest
        self._master_key = master_key
        self._read_order = read_order
        self._config = (config or DriverConfig()).validate()
        self._read_config = read_config
        self._lac = int(metadata.last_entry_id)
        self._poll_index = 0

    @property
    def ledger_id(self) -> LedgerId:
        return self._md.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def is_closed(self) -> bool:
        return self._md.is_closed

    @property
    def last_add_confirmed(self) -> EntryId:
        """The last entry known confirmed (for a closed ledger: its last entry)."""
        return EntryId(self._md.last_entry_id if self._md.is_closed else self._lac)

    def _operation(self, core: Any) -> Operation:
        return Operation(
            core, ledger_id=self._md.ledger_id, store=self._store, transport=self._transport,
            master_key=self._master_key, config=self._config,
        )

    async def refresh(self) -> LedgerMetadata:
        """Re-read the ledger's record (state, ensembles, last entry)."""
        self._md = await read_ledger_metadata(self._store, self._md.ledger_id, self._config.metadata_timeout_s)
        return self._md

    async def read_last_add_confirmed(self) -> EntryId:
        """The LAC: the record's last entry if closed, else max LAC of a quorum of bookies."""
        if self._md.is_closed:
            return self._md.last_entry_id
        core = LacReadCore(self._md)
        op = self._operation(core)
        async for _ in op.run(core.start()):
            pass
        lac = op.result
        if not isinstance(lac, int):
            raise InternalError("LAC read finished without a value")
        self._lac = max(self._lac, lac)
        return EntryId(self._lac)

    async def read(self, first: int = 0, last: int | None = None) -> AsyncIterator[Entry]:
        """Entries ``first..last`` (default: to the LAC), verified, in order.

        Only confirmed entries: beyond the LAC (or a closed ledger's last entry)
        raises ``NoSuchEntryError``.
        """
        bound = self.last_add_confirmed
        if last is None or last > bound:
            if not self._md.is_closed:
                bound = await self.read_last_add_confirmed()
            if last is None:
                last = bound
        if last > bound:
            raise NoSuchEntryError(
                f"ledger {self._md.ledger_id}: entry {last} is beyond the last confirmed "
                f"entry {bound}"
            )
        if first < 0:
            raise NoSuchEntryError(f"ledger {self._md.ledger_id}: entry {first} < 0")
        if first > last:
            return
        core = ReadCore(
            self._md, first, last, digest=self._digest, read_order=self._read_order,
            config=self._read_config,
        )
        async for batch in self._operation(core).run(core.start()):
            for entry in batch:
                yield entry

    async def tail(self, start: int = 0) -> AsyncIterator[Entry]:
        """Follow the ledger from ``start``: every entry in order, ending once it is closed."""
        next_id = start
        failures = 0
        while True:
            if self._md.is_closed:
                if next_id <= self._md.last_entry_id:
                    async for entry in self.read(next_id, self._md.last_entry_id):
                        yield entry
                return
            if next_id <= self._lac:
                last = self._lac
                async for entry in self.read(next_id, last):
                    yield entry
                next_id = last + 1
                continue
            advanced = await self._long_poll()
            if advanced is None:  # that bookie failed: back off (bounded), try the next
                failures += 1
                await asyncio.sleep(min(0.05 * failures, 1.0))
            else:
                failures = 0
            if not advanced:
                await self.refresh()

    async def _long_poll(self) -> bool | None:
        ensemble = self._md.current_ensemble
        bookie_id = ensemble[self._poll_index % len(ensemble)]
        try:
            async with asyncio.timeout(self._config.long_poll_s + self._config.read_timeout_s):
                result = await self._transport.long_poll_lac(
                    bookie_id, self._md.ledger_id, EntryId(self._lac), wait_s=self._config.long_poll_s
                )
        except (ScribaError, builtins.TimeoutError) as exc:
            log.debug("long_poll_failed", ledger_id=self._md.ledger_id, bookie_id=bookie_id, error=str(exc))
            self._poll_index += 1
            return None
        if result.lac > self._lac:
            self._lac = int(result.lac)
            return True
        return False

    async def close(self) -> None:
        """Nothing to release (reads hold no resources between calls)."""
