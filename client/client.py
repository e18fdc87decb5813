"""``Client``: the public asyncio API for ledgers.

    client = await Client.connect("etcd://127.0.0.1:2379/scriba")
    async with Client.connect(uri) as client:
        w = await client.create_ledger(3, 3, 2, password=b"secret")
        entry_id = await w.append(b"payload")
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=b"secret")
        async for e in r.read(0, r.last_add_confirmed): ...

A client holds one metadata store session, one ``BookieRegistry`` (a watch on the
registered bookies) and one ``BookieTransport`` (gRPC unless one is passed in).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scriba.client.driver import DriverConfig, read_ledger_metadata
from scriba.client.operation import recover_ledger
from scriba.client.read_core import ReadConfig, ReadOrder
from scriba.client.reader import LedgerReader
from scriba.client.recovery_core import RecoveryConfig
from scriba.client.registry import BookieRegistry
from scriba.client.transport import BookieTransport
from scriba.client.write_core import ChooseReplacement, WriteConfig, WriteCore
from scriba.client.writer import LedgerWriter
from scriba.clock import Clock, SystemClock
from scriba.config import require
from scriba.entry import Digest, make_digest, master_key, password_hash
from scriba.errors import (
    ConfigError,
    DeadlineExceededError,
    KeyExistsError,
    NoSuchKeyError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ScribaError,
    UnauthorizedError,
)
from scriba.ids import BookieId, LedgerId
from scriba.log import get_logger
from scriba.meta.records import (
    LEDGER_ID_SEQUENCE,
    LEDGERS_PREFIX,
    DigestType,
    Ensemble,
    LedgerMetadata,
    ledger_id_from_key,
    ledger_key,
)
from scriba.meta.store import MetadataStore
from scriba.retry import RetryPolicy, retry_async
from scriba.tls import TlsConfig

log = get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    add_timeout_s: float = 10.0
    # the metadata session the client opens (None: the store's default); how long a dead
    # process's ephemeral records (an RSM leader's election, a stream writer's lock) live
    metadata_session_timeout_s: float | None = None
    bookie_wait_s: float = 10.0  # create_ledger waits this long for enough writable bookies
    registry_sync_s: float = 10.0
    failed_bookie_quarantine_s: float = 30.0  # replacements avoid bookies failed this recently
    recovery_attempts_max: int = 3  # open_ledger retries a recovery that failed retriably
    recovery_retry_s: float = 0.2  # the first backoff window; it doubles per retry (scriba.retry)
    # keep a ledger's password in its metadata (as BookKeeper does) so autorecovery can
    # re-replicate it unaided; off: workers must be given the password (--password)
    store_password_in_metadata: bool = True
    # "binary": the binary data path to bookies that offer it, gRPC to the others;
    # "grpc": gRPC only (TransportConfig.protocol)
    transport_protocol: str = "binary"
    driver: DriverConfig = field(default_factory=DriverConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    read: ReadConfig = field(default_factory=ReadConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    tls: TlsConfig | None = None  # TLS to the bookies (mutual when it carries a cert and key)

    def validate(self) -> ClientConfig:
        require(self.add_timeout_s > 0, "add_timeout_s", "must be > 0")
        require(self.metadata_session_timeout_s is None or self.metadata_session_timeout_s > 0,
                "metadata_session_timeout_s", "must be > 0")
        require(self.bookie_wait_s >= 0, "bookie_wait_s", "must be >= 0")
        require(self.registry_sync_s > 0, "registry_sync_s", "must be > 0")
        require(self.failed_bookie_quarantine_s >= 0, "failed_bookie_quarantine_s", "must be >= 0")
        require(self.recovery_attempts_max >= 1, "recovery_attempts_max", "must be >= 1")
        require(self.recovery_retry_s >= 0, "recovery_retry_s", "must be >= 0")
        require(self.transport_protocol in ("binary", "grpc"), "transport_protocol", "'binary' or 'grpc'")
        self.driver.validate()
        self.write.validate()
        self.read.validate()
        self.recovery.validate()
        if self.tls is not None:
            self.tls.validate()
        return self


class _Connecting:
    """What ``Client.connect`` returns: awaitable, and an async context manager."""

    def __init__(self, opening: Any) -> None:
        self._opening = opening
        self._client: Client | None = None

    def __await__(self) -> Generator[Any, None, Client]:
        return self._opening().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._opening()
        return self._client

    async def __aexit__(self, *exc_info: object) -> None:
        if self._client is not None:
            await self._client.close()


class Client:
    """A connection to a Scriba cluster (see the module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        registry: BookieRegistry,
        transport: BookieTransport,
        *,
        placement: str,
        placement_options: Mapping[str, Any] | None,
        config: ClientConfig,
        owns_store: bool,
        owns_transport: bool,
        clock: Clock,
        rng: random.Random,
        local: str | None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._transport = transport
        self._config = config
        self._owns_store = owns_store
        self._owns_transport = owns_transport
        self._clock = clock
        self._rng = rng
        self._local = local
        self._placement_name = placement
        self._placement_options = dict(placement_options or {})
        self._policy = self._make_policy(placement, self._placement_options)
        self._failed_at: dict[BookieId, float] = {}  # bookie -> when it was last replaced
        self._closed = False

    # --- connect / close ---------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        uri: str,
        *,
        placement: str = "random",
        placement_options: Mapping[str, Any] | None = None,
        transport: BookieTransport | None = None,
        store: MetadataStore | None = None,
        config: ClientConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        local: str | None = None,
    ) -> _Connecting:
        """Open a client: ``await Client.connect(uri)`` or ``async with Client.connect(uri)``.

        ``store``/``transport`` may be passed in (tests, simulation); the client then
        leaves closing them to the caller. ``local`` (``/region/zone/rack``) orders
        reads nearest first.
        """
        cfg = (config or ClientConfig()).validate()

        async def opening() -> Client:
            owns_store = store is None
            if store is None:
                from scriba.meta.connect import connect as connect_store

                the_store = await (
                    connect_store(uri) if cfg.metadata_session_timeout_s is None
                    else connect_store(uri, session_timeout_s=cfg.metadata_session_timeout_s)
                )
            else:
                the_store = store
            registry = BookieRegistry(the_store)
            try:
                await registry.start(cfg.registry_sync_s)
                owns_transport = transport is None
                if transport is None:
                    from scriba.client.binary_transport import new_transport
                    from scriba.client.transport import TransportConfig

                    the_transport: BookieTransport = new_transport(
                        registry,
                        TransportConfig(
                            add_timeout_s=cfg.add_timeout_s, read_timeout_s=cfg.driver.read_timeout_s,
                            protocol=cfg.transport_protocol,
                            tls=cfg.tls,
                        ),
                    )
                else:
                    the_transport = transport
                return cls(
                    the_store, registry, the_transport,
                    placement=placement, placement_options=placement_options, config=cfg,
                    owns_store=owns_store, owns_transport=owns_transport,
                    clock=clock or SystemClock(), rng=rng or random.Random(), local=local,
                )
            except BaseException:
                await registry.close()
                if owns_store:
                    await the_store.close()
                raise

        return _Connecting(opening)

    async def close(self) -> None:
        """Release the transport, the registry watch and the metadata session."""
        if self._closed:
            return
        self._closed = True
        await self._registry.close()
        if self._owns_transport:
            await self._transport.close()
        if self._owns_store:
            await self._store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- views -------------------------------------------------------------------------
    @property
    def store(self) -> MetadataStore:
        return self._store

    @property
    def registry(self) -> BookieRegistry:
        return self._registry

    @property
    def transport(self) -> BookieTransport:
        return self._transport

    # --- ledgers -----------------------------------------------------------------------
    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum_size: int = 3,
        ack_quorum_size: int = 2,
        password: bytes = b"",
        digest: str = "crc32c",
        custom_metadata: Mapping[str, str] | None = None,
        placement: str | None = None,
        placement_options: Mapping[str, Any] | None = None,
    ) -> LedgerWriter:
        """Create a ledger on an ensemble chosen by the placement policy; returns its writer."""
        self._check_open()
        require(
            ensemble_size >= write_quorum_size >= ack_quorum_size >= 1,
            "quorums",
            f"need ensemble_size >= write_quorum_size >= ack_quorum_size >= 1, got "
            f"{ensemble_size}/{write_quorum_size}/{ack_quorum_size}",
        )
        digest_impl = make_digest(digest, password)
        policy = self._policy
        if placement is not None or placement_options is not None:
            policy = self._make_policy(placement or self._placement_name, placement_options or {})
        try:
            await self._registry.wait_for_bookies(ensemble_size, self._config.bookie_wait_s)
        except NotEnoughBookiesError:
            pass  # placement below names the constraint and the counts
        result = policy.new_ensemble(
            self._registry.topology(), ensemble_size, write_quorum_size, ack_quorum_size,
            local=self._local,
        )
        ensemble: Ensemble = tuple(BookieId(b) for b in result.bookies)
        ledger_id = LedgerId(await self._meta(self._store.allocate_id(LEDGER_ID_SEQUENCE)))
        metadata = LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            ensembles=((0, ensemble),),  # type: ignore[arg-type]
            digest_type=DigestType(digest),
            password_hash=password_hash(password),
            ctime_ms=int(self._clock.wall() * 1000),
            custom_metadata=dict(custom_metadata or {}),
            placement_policy=policy.name,
            placement_options=dict(policy.options),
            password=password if password and self._config.store_password_in_metadata else None,
            **self._durability_regions(policy, ensemble, ack_quorum_size),
        )
        try:
            version = await self._meta(self._store.create(ledger_key(ledger_id), metadata.to_bytes()))
        except KeyExistsError:
            raise ScribaError(f"ledger id {ledger_id} allocated twice (metadata store bug)") from None
        core = WriteCore(
            metadata,
            digest=digest_impl,
            choose_replacement=self._chooser(policy, write_quorum_size, ack_quorum_size),
            config=self._config.write,
            region_of=self._region_of,
        )
        writer = LedgerWriter(
            core, store=self._store, transport=self._transport,
            master_key=master_key(password), config=self._config.driver, limits=self._registry,
            record_version=version,
        )
        log.info("ledger_created", ledger_id=ledger_id, ensemble=list(ensemble))
        return writer

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> LedgerReader:
        """Open for reading. ``recovery=True`` fences, recovers and closes an open ledger."""
        self._check_open()
        metadata = await read_ledger_metadata(
            self._store, ledger_id, self._config.driver.metadata_timeout_s
        )
        if metadata.password_hash != password_hash(password):
            raise UnauthorizedError(f"ledger {ledger_id}: wrong password")
        digest = make_digest(metadata.digest_type.value, password)
        key = master_key(password)
        if recovery and not metadata.is_closed:
            metadata = await self._recover(metadata, digest, key)
        return LedgerReader(
            metadata, store=self._store, transport=self._transport, digest=digest,
            master_key=key, read_order=self._read_order(metadata),
            config=self._config.driver, read_config=self._config.read,
        )

    async def _recover(self, metadata: LedgerMetadata, digest: Digest, key: bytes) -> LedgerMetadata:
        """Recover and close, retrying a recovery that failed retriably (from a fresh read)."""
        ledger_id = metadata.ledger_id
        first = [metadata]  # the first attempt starts from the record read by open_ledger

        async def attempt() -> LedgerMetadata:
            current = first.pop() if first else await read_ledger_metadata(
                self._store, ledger_id, self._config.driver.metadata_timeout_s
            )
            if current.is_closed:  # another recovery finished meanwhile
                return current
            chooser = None
            if current.min_regions_for_durability > 1:
                # A lost region can leave the tail's write sets short: move it (keeping
                # the regions) instead of failing for ever.
                chooser = self._chooser(
                    self._make_policy(current.placement_policy, current.placement_options),
                    current.write_quorum_size, current.ack_quorum_size,
                )
            return await recover_ledger(
                current, digest=digest, store=self._store, transport=self._transport,
                master_key=key, config=self._config.driver, recovery_config=self._config.recovery,
                choose_replacement=chooser, region_of=self._region_of,
            )

        def on_retry(attempt: int, error: BaseException, delay_s: float) -> None:
            log.warning("recovery_retry", ledger_id=ledger_id, attempt=attempt, error=str(error))

        cfg = self._config
        policy = RetryPolicy(cfg.recovery_attempts_max, cfg.recovery_retry_s, cfg.recovery_retry_s * 8)
        return await retry_async(
            attempt, policy=policy, what=f"recover ledger {ledger_id}", clock=self._clock,
            rng=self._rng, on_retry=on_retry,
        )

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await read_ledger_metadata(self._store, ledger_id, self._config.driver.metadata_timeout_s)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's record; bookies reclaim its entries in their next GC."""
        self._check_open()
        try:
            await self._meta(self._store.delete(ledger_key(ledger_id)))
        except NoSuchKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        log.info("ledger_deleted", ledger_id=ledger_id)

    async def list_ledgers(self) -> list[LedgerId]:
        self._check_open()
        async def scan() -> list[LedgerId]:
            return [ledger_id_from_key(key) async for key, _ in self._store.scan(LEDGERS_PREFIX)]

        return await self._meta(scan(), self._config.driver.metadata_timeout_s * 6)

    # --- internals ---------------------------------------------------------------------
    async def _meta(self, call: Awaitable[T], timeout_s: float | None = None) -> T:
        """A metadata store call with a deadline (``TimeoutError`` from scriba.errors)."""
        limit = timeout_s if timeout_s is not None else self._config.driver.metadata_timeout_s
        try:
            async with asyncio.timeout(limit):
                return await call
        except TimeoutError:
            raise DeadlineExceededError(f"metadata store {self._store.uri}: no answer in {limit} s") from None

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("client is closed")

    def _make_policy(self, name: str, options: Mapping[str, Any]) -> Any:
        from scriba.placement import make_policy

        return make_policy(name, options, rng=self._rng)

    def _region_of(self, bookie_id: BookieId) -> str | None:
        node = self._registry.topology().nodes.get(bookie_id)
        return None if node is None else str(node.location.region)

    def _durability_regions(self, policy: Any, ensemble: Ensemble, ack_quorum_size: int) -> dict[str, Any]:
        """The record's fields for the synchronous geo mode: ``min_regions_for_durability``
        (from the policy) and the ensemble's regions, when the ack rule counts regions."""
        regions_min = int(policy.regions_for_durability)
        if regions_min == 1:
            return {}
        require(
            regions_min <= ack_quorum_size, "min_regions_for_durability",
            f"{regions_min} regions need an ack quorum of at least {regions_min}, got {ack_quorum_size}",
        )
        regions = {b: r for b in ensemble if (r := self._region_of(b))}
        return {"min_regions_for_durability": regions_min, "bookie_regions": regions}

    def _chooser(self, policy: Any, write_quorum_size: int, ack_quorum_size: int) -> ChooseReplacement:
        """Replacement choice: avoid bookies that failed recently, if that leaves any."""
        registry = self._registry
        failed_at = self._failed_at
        clock = self._clock
        quarantine_s = self._config.failed_bookie_quarantine_s

        def choose(ensemble: Ensemble, index: int, exclude: frozenset[BookieId]) -> BookieId:
            now = clock.monotonic()
            failed_at[ensemble[index]] = now
            for bookie_id, when in list(failed_at.items()):
                if now - when > quarantine_s:
                    del failed_at[bookie_id]
            topology = registry.topology()
            recent = frozenset(failed_at) - exclude
            attempts = (exclude | recent, exclude) if recent else (exclude,)
            for i, excluded in enumerate(attempts):
                try:
                    result = policy.replace_bookie(
                        topology, ensemble, index, write_quorum_size, ack_quorum_size,
                        exclude=excluded,
                    )
                except NotEnoughBookiesError:
                    if i + 1 == len(attempts):
                        raise
                    continue
                chosen = BookieId(result.bookies[index])
                log.info("bookie_replaced", bookie_id=ensemble[index], replacement=chosen)
                return chosen
            raise NotEnoughBookiesError("no replacement")  # not reached

        return choose

    def _read_order(self, metadata: LedgerMetadata) -> ReadOrder:
        try:
            policy = self._make_policy(metadata.placement_policy, metadata.placement_options)
        except ConfigError:
            policy = self._policy
        registry = self._registry
        local = self._local

        def order(write_set: Sequence[BookieId]) -> list[BookieId]:
            return list(policy.read_order(registry.topology(), write_set, local=local))

        return order

