"""One bookie: storage + gRPC service + registration + GC + HTTP, with a clean shutdown.

Start order: check the dirs and the listen address (a clear error before any work) ->
connect to the metadata store -> check (or create) cookies -> open storage (replays the
journal) -> start gRPC -> start the binary data path (``binary_server``; its address is
advertised in the registration beside the gRPC one) -> start HTTP -> register
(ephemeral) -> GC. The metadata steps (connect, cookies, register) retry a lost
connection or session within ``metadata_start_timeout_s`` each (``meta/startup.py``);
any other failure ends the start at once with its typed error. A SIGTERM during a start
that is still retrying ends it (everything opened so far is closed; exit code 0).
Stop order (SIGTERM): refuse new adds -> deregister -> let accepted adds finish (bounded)
-> stop the binary listener and gRPC -> checkpoint and close storage -> close HTTP and the metadata session.

States the service sees (``ServingState``): not started (GetBookieInfo says UNKNOWN,
adds READ_ONLY) -> serving (adds accepted while registered and storage writable) ->
shutting down. A LOST metadata session makes it refuse adds until re-registered;
storage turning read-only (disk full, disk error) is written to the registration.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from scriba.bookie.binary_server import BinaryServer
from scriba.bookie.config import BookieConfig
from scriba.bookie.cookie import verify_or_create
from scriba.bookie.gc import GarbageCollector
from scriba.bookie.http import HttpEndpoint
from scriba.bookie.metrics import BookieMetrics
from scriba.bookie.registration import Registration
from scriba.bookie.service import BookieService, new_grpc_server
from scriba.bookie.serving import ServingState
from scriba.bookie.storage_api import LedgerStorage, StorageConfig
from scriba.errors import ConfigError
from scriba.grpc_auth import bind
from scriba.log import get_logger
from scriba.meta.connect import connect
from scriba.meta.records import BookieMode, BookieRegistration
from scriba.meta.startup import StartAbandoned, retry_start_step, start_unless_stopped
from scriba.meta.store import MetadataStore
from scriba.tls import LoadedTls

log = get_logger(__name__)

T = TypeVar("T")

StorageFactory = Callable[[StorageConfig], Awaitable[LedgerStorage]]


async def _default_storage_factory(config: StorageConfig) -> LedgerStorage:
    from scriba.bookie.storage import open_storage

    return await open_storage(config)


class Bookie:
    def __init__(
        self,
        config: BookieConfig,
        *,
        storage_factory: StorageFactory | None = None,
        store: MetadataStore | None = None,
        binary_ssl: ssl.SSLContext | None = None,
    ) -> None:
        """``binary_ssl``: the binary listener's ``SSLContext`` (None: the one of
        ``config.tls``, or plain TCP without TLS)."""
        self.config = config.validate()
        self._binary_ssl = binary_ssl
        self._binary: BinaryServer | None = None
        self.binary_address = ""
        self._storage_factory = storage_factory or _default_storage_factory
        self._store: MetadataStore | None = store
        self._own_store = store is None
        self.metrics = BookieMetrics()
        self.state = ServingState(config.resolved_bookie_id)
        self.storage: LedgerStorage | None = None
        self.service: BookieService | None = None
        self.registration: Registration | None = None
        self.gc: GarbageCollector | None = None
        self._server: Any = None
        self._http: HttpEndpoint | None = None
        self._mode_dirty = asyncio.Event()
        self._mode_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls: LoadedTls | None = None
        self._stopped = False
        self.address = config.advertised_address
        self.port = config.listen_port

    @property
    def bookie_id(self) -> str:
        return self.state.bookie_id

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            raise ConfigError("bookie not started")
        return self._store

    @property
    def http_address(self) -> str:
        return self._http.address if self._http is not None else ""

    async def start(self) -> None:
        cfg = self.config
        check_dirs(cfg)
        check_listen(cfg.listen_host, cfg.listen_port)
        self._tls = cfg.tls.load() if cfg.tls is not None else None  # a bad file: ConfigError, no start
        self._loop = asyncio.get_running_loop()
        if self._store is None:
            self._store = await self._start_step("connect", lambda: connect(
                cfg.metadata_uri,
                connect_timeout_s=cfg.metadata_connect_timeout_s,
                session_timeout_s=cfg.metadata_session_timeout_s,
            ), needs_session=False)
        try:
            await self._start_serving()
        except BaseException:
            await self._abort_start()
            raise

    async def _start_step(self, step: str, call: Callable[[], Awaitable[T]], *, needs_session: bool = True) -> T:
        """A metadata step of start-up, retried within ``metadata_start_timeout_s``."""
        return await retry_start_step(
            step, call, owner=f"bookie {self.bookie_id}", timeout_s=self.config.metadata_start_timeout_s,
            log_event="bookie_start_retry", log_fields={"bookie_id": self.bookie_id},
            session=(lambda: self.store.session) if needs_session else None,
        )

    async def _start_serving(self) -> None:
        cfg = self.config
        store = self.store
        await self._start_step(
            "cookie check", lambda: verify_or_create(store, self.bookie_id, cfg.cookie_dirs, [cfg.data_dir])
        )
        storage_config = StorageConfig(
            journal_dir=cfg.storage_journal_dir,
            ledger_dir=cfg.storage_ledger_dir,
            entry_size_max=cfg.entry_size_max,
            **cfg.storage_options,
        )
        storage_config.validate()
        self.storage = storage = await self._storage_factory(storage_config)
        stats = getattr(storage, "stats", None) or getattr(storage, "journal_stats", None)
        if callable(stats):
            self.metrics.watch_storage(stats)
        self.service = BookieService(
            storage,
            self.state,
            self.metrics,
            entry_size_max=cfg.entry_size_max,
            inflight_bytes_per_connection_max=cfg.inflight_bytes_per_connection_max,
            batch_entries_max=cfg.batch_entries_max,
            long_poll_timeout_ms_max=cfg.long_poll_timeout_ms_max,
            read_range_entries_max=cfg.read_range_entries_max,
            read_range_bytes_max=cfg.read_range_bytes_max,
            tls=self._tls,
        )
        await self._start_grpc(self.service)
        if cfg.binary_port is not None:
            await self._start_binary(self.service)
        if cfg.http_host is not None:
            self._http = HttpEndpoint(cfg.http_host, cfg.http_port, health=self._health,
                                      metrics=self.metrics.exposition, gc=lambda: self.gc, tls=self._tls)
            await self._http.start()
        free, total = self._disk_usage()
        record = BookieRegistration(
            bookie_id=self.bookie_id,  # type: ignore[arg-type]
            address=self.address,
            region=cfg.region,
            zone=cfg.zone,
            rack=cfg.rack,
            mode=BookieMode.READ_ONLY if storage.read_only else BookieMode.READ_WRITE,
            free_bytes=free,
            total_bytes=total,
            http_address=self.http_address,
            version=_version(),
            entry_size_max=cfg.entry_size_max,  # clients refuse larger payloads up front
            binary_address=self.binary_address,
        )
        self.metrics.read_only.set(1 if storage.read_only else 0)
        storage.add_state_listener(self._on_storage_state)
        self.registration = Registration(
            store, record, on_change=self._on_registered, retry_s=cfg.registration_retry_s
        )
        self._mode_task = asyncio.get_running_loop().create_task(self._sync_mode())
        await self._start_step("registration", self.registration.register)
        self.registration.follow_session()
        self.state.started = True
        self.gc = GarbageCollector(
            storage, store, self.metrics, bookie_id=self.bookie_id, interval_s=cfg.gc_interval_s,
            policy=cfg.compaction_policy,
        )
        self.gc.start()
        log.info("bookie_started", bookie_id=self.bookie_id, address=self.address, binary=self.binary_address,
                 http=self.http_address, region=cfg.region, zone=cfg.zone, rack=cfg.rack)

    async def _start_grpc(self, service: BookieService) -> None:
        cfg = self.config
        self._server = new_grpc_server(service, cfg.grpc_message_bytes_max, tls=self._tls)
        address = _host_port(cfg.listen_host, cfg.listen_port)
        port = bind(self._server, address, self._tls)  # 0: taken since check_listen
        if port == 0:
            raise ConfigError(f"listen {address}: cannot bind (address in use?)")
        self.port = port
        host = cfg.advertised_address.rpartition(":")[0]
        self.address = f"{host}:{port}"
        await self._server.start()

    async def _start_binary(self, service: BookieService) -> None:
        cfg = self.config
        port = cfg.binary_port or 0
        tls = self._tls  # a TLS bookie serves the binary path over TLS too, with the same allow-lists
        ssl_context = self._binary_ssl or (tls.server_ssl_context() if tls is not None else None)
        self._binary = BinaryServer(
            service, self.state, frame_bytes_max=cfg.grpc_message_bytes_max, ssl_context=ssl_context, tls=tls
        )
        try:
            port = await self._binary.start(cfg.listen_host, port)
        except OSError as exc:
            raise ConfigError(f"binary listen {_host_port(cfg.listen_host, port)}: {exc.strerror}") from None
        self.binary_address = f"{self.address.rpartition(':')[0]}:{port}"

    def _disk_usage(self) -> tuple[int, int]:
        try:
            free, total = self.storage.disk_usage() if self.storage is not None else (0, 0)
        except OSError:
            return 0, 0
        self.metrics.free_bytes.set(free)
        self.metrics.total_bytes.set(total)
        return free, total

    def _health(self) -> tuple[bool, dict[str, object]]:
        st = self.state
        read_only = self.storage.read_only if self.storage is not None else True
        ok = st.started and not st.shutting_down and self.registration is not None and self.registration.registered
        return ok, {
            "bookie_id": st.bookie_id,
            "registered": bool(self.registration and self.registration.registered),
            "read_only": read_only,
            "reason": self.storage.read_only_reason if self.storage is not None and read_only else "",
            "shutting_down": st.shutting_down,
        }

    def _on_registered(self, registered: bool) -> None:
        self.state.accepting_adds = registered and not self.state.shutting_down
        self.metrics.registered.set(1 if registered else 0)

    def _on_storage_state(self, read_only: bool, reason: str) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._mode_changed(read_only, reason)
        else:
            loop.call_soon_threadsafe(self._mode_changed, read_only, reason)

    def _mode_changed(self, read_only: bool, reason: str) -> None:
        log.warning("bookie_mode_changed", bookie_id=self.bookie_id,
                    mode="READ_ONLY" if read_only else "READ_WRITE", reason=reason)
        self.metrics.read_only.set(1 if read_only else 0)
        self._mode_dirty.set()

    async def _sync_mode(self) -> None:
        """Keep the registration's mode and disk figures current (one writer, latest wins).

        Written at once when the storage's read-only state changes, and every
        ``registration_refresh_s`` when free space moved by more than 1% of the disk.
        """
        while True:
            try:
                await asyncio.wait_for(self._mode_dirty.wait(), self.config.registration_refresh_s)
            except TimeoutError:
                if self.registration is None or self.storage is None:
                    continue
                free, total = self._disk_usage()
                record = self.registration.record
                if abs(free - record.free_bytes) <= total // 100:
                    continue
            self._mode_dirty.clear()
            if self.registration is None or self.storage is None:
                continue
            free, total = self._disk_usage()
            mode = BookieMode.READ_ONLY if self.storage.read_only else BookieMode.READ_WRITE
            try:
                await self.registration.set_mode(mode, free, total)
            except Exception as exc:
                log.warning("registration_mode_sync_failed", bookie_id=self.bookie_id, error=repr(exc))

    async def stop(self) -> None:
        """Graceful shutdown (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        st = self.state
        st.shutting_down = True
        st.accepting_adds = False
        log.info("bookie_stopping", bookie_id=self.bookie_id)
        if self.registration is not None:
            await self.registration.close()
        if self.service is not None:
            await self.service.drain(self.config.shutdown_grace_s)
        if self.gc is not None:
            await self.gc.stop()
        await self._cancel_mode_task()
        if self._binary is not None:
            await self._binary.stop()
        if self._server is not None:
            await self._server.stop(grace=min(1.0, self.config.shutdown_grace_s))
        if self.storage is not None:
            try:
                await self.storage.close()  # finishes queued journal writes and checkpoints
            except Exception as exc:
                log.warning("storage_close_failed", bookie_id=self.bookie_id, error=repr(exc))
        if self._http is not None:
            await self._http.stop()
        if self._own_store and self._store is not None:
            await self._store.close()
        log.info("bookie_stopped", bookie_id=self.bookie_id)

    async def _cancel_mode_task(self) -> None:
        if self._mode_task is not None:
            self._mode_task.cancel()
            try:
                await self._mode_task
            except asyncio.CancelledError:
                pass
            self._mode_task = None

    async def _abort_start(self) -> None:
        self._stopped = True
        await self._cancel_mode_task()
        if self._binary is not None:
            await self._binary.stop()
        if self._server is not None:
            await self._server.stop(grace=0)
        if self.storage is not None:
            await self.storage.close()
        if self._http is not None:
            await self._http.stop()
        if self._own_store and self._store is not None:
            await self._store.close()

    async def run_until_signal(self) -> int:
        """Start, serve until SIGTERM/SIGINT, shut down cleanly; the process exit code."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await start_unless_stopped(self.start(), stop)
        except StartAbandoned:
            log.info("bookie_start_abandoned", bookie_id=self.bookie_id)
            return 0
        print(f"bookie {self.bookie_id} serving on {self.address}", flush=True)
        await stop.wait()
        log.info("signal_received", bookie_id=self.bookie_id)
        await self.stop()
        return 0


def check_dirs(config: BookieConfig) -> None:
    """ConfigError naming the path when a data or journal dir cannot be a directory (it,
    or the first of its parents that exists, is a file)."""
    for kind, d in (("data", config.data_dir), ("journal", config.journal_dir)):
        if d is None:
            continue
        path = Path(d)
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            where = "" if existing == path else f" ({existing} is a file)"
            raise ConfigError(f"{kind} dir {path}: not a directory{where}")


def check_listen(host: str, port: int) -> None:
    """ConfigError naming the address when no socket can be bound there (in use, not a
    local address), before the bookie does any work. Port 0 (any free port) always fits."""
    if port == 0:
        return
    address = _host_port(host, port)
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"listen {address}: {exc.strerror}") from None
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:  # gRPC serves if any of them binds
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                probe.bind(sockaddr)
                return
            except OSError as exc:
                error = exc
    if error is not None:
        reason = "address already in use" if error.errno == errno.EADDRINUSE else error.strerror
        raise ConfigError(f"listen {address}: {reason}")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _version() -> str:
    from scriba import __version__

    return str(__version__)
