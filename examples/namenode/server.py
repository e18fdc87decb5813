"""The WebHDFS endpoint of one namenode replica (aiohttp).

    nn = NameNode(client, replica_id="nn1", rsm_address="127.0.0.1:9871", namespace="namenode")
    await nn.start(); runner = await serve(nn, "127.0.0.1", 9870)

Theory of operation. Each replica runs the namespace as an RSM replica
(``ReplicatedStateMachine`` with :class:`NamenodeMachine`); the RSM's leader is the
**active**, the others are **standbys**. A namespace change becomes an edit record
proposed through this process's exactly-once session (``rsm.submit``): on a standby
the RSM forwards it to the active, so **writes on a standby are forwarded** (a client
sees no StandbyException while some active is known; with none it gets
``StandbyException`` and HdfsCLI tries its next URL). Reads are RSM reads, by default
``linearizable`` (a client failing over between replicas still sees its own writes);
``scriba_consistency=after&scriba_after=<position>`` asks for the Observer-style
"after" read (the position a write answered in ``X-Scriba-Position``), and
``scriba_consistency=sequential`` for a local read.

CREATE and APPEND are WebHDFS's two steps: the first answers ``307`` to this same
server's data URL (``...&data=true``); the second proposes ``CREATE`` (or
``APPEND``), streams the body into ledgers (``BlockWriter``), proposes ``ADD_BLOCK``
for each closed block and ``COMPLETE`` at the end, then answers. An upload that fails
midway completes the file with the blocks recorded so far (like HDFS's lease recovery). OPEN reads the
file's blocks from the ledgers and answers the bytes directly (no redirect; both
HdfsCLI and fsspec accept that). Ledgers freed by delete or overwrite are deleted
best-effort after the edit is confirmed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlencode

from aiohttp import web

from scriba.aiohttp_tls import identity_middleware, site_ssl
from scriba.client import Client
from scriba.errors import (
    ClientSessionError,
    CommandOutcomeUnknownError,
    ReplicaStoppedError,
    RsmNotLeaderError,
    ScribaError,
)
from scriba.examples.namenode import edits as e
from scriba.examples.namenode import permissions as perm
from scriba.examples.namenode.blocks import BlockWriter, block_locations, read_range
from scriba.examples.namenode.edits import Block
from scriba.examples.namenode.errors import (
    AccessControlException,
    HdfsError,
    IllegalArgumentException,
    RetriableException,
    StandbyException,
)
from scriba.examples.namenode.machine import NamenodeMachine, parse_answer
from scriba.examples.namenode.namespace import split_path
from scriba.examples.namenode.webhdfs_params import Params
from scriba.log import get_logger
from scriba.rsm import ClientSession, ReplicatedStateMachine, RsmConfig, while_leaderless
from scriba.stream import Position
from scriba.tls import LoadedTls, Role

log = get_logger(__name__)

PREFIX: Final = "/webhdfs/v1"
CHUNK_BYTES: Final = 64 * 1024
LISTING_LIMIT: Final = 1000

Handler = Callable[["NameNode", str, Params, web.Request], Awaitable[web.StreamResponse]]


class NameNode:
    def __init__(self, client: Client, *, replica_id: str, rsm_address: str, namespace: str = "namenode",
                 config: RsmConfig | None = None) -> None:
        self.client = client
        self.machine = NamenodeMachine()
        self.rsm = ReplicatedStateMachine(client, namespace=namespace, name="namenode", state_machine=self.machine,
                                          replica_id=replica_id, address=rsm_address, config=config)
        self.replica_id = replica_id
        self.url = ""  # this server's base URL, set by serve()
        self._session: ClientSession | None = None

    async def start(self) -> None:
        await self.rsm.start()

    async def stop(self) -> None:
        await self.rsm.stop()

    @property
    def role(self) -> str:
        return "active" if self.rsm.is_leader else "standby"

    async def propose(self, edit: e.Edit) -> tuple[Any, Position]:
        """Apply ``edit`` through the edit log (exactly once); its result, or its ``HdfsError``."""
        for _ in range(2):
            if self._session is None:
                self._session = await while_leaderless(self.rsm.open_session, self.rsm.config.propose_timeout_s)
            try:
                committed = await self.rsm.submit(e.encode(edit), session=self._session)
            except ClientSessionError:
                self._session = None  # expired: a rejected command was not applied; open a new one
                continue
            _, result = parse_answer(committed.result)
            return result, committed.position
        raise RetriableException("the namenode's edit-log session was rejected twice")

    async def read(self, request: dict[str, Any], params: Params) -> Any:
        consistency = params.text("scriba_consistency", "linearizable")
        after = params.text("scriba_after", "") or None
        if consistency == "after" and after is None:
            raise IllegalArgumentException("scriba_consistency=after needs scriba_after=<position>")
        body = json.dumps({**request, "user": params.user}).encode()
        answer = await while_leaderless(lambda: self.rsm.read(body, consistency, after=after),
                                        self.rsm.config.read_timeout_s)
        return parse_answer(answer)[1]

    async def transfer(self, target: str | None) -> str:
        """Graceful fail-over: hand the active role to ``target`` (None: the most caught-up
        live standby); returns the new active's id once the election names it."""
        if not self.rsm.is_leader:
            raise StandbyException(f"{self.replica_id} is not active; only the active can hand over its role")
        standbys = [m for m in await self.rsm.members() if m.replica_id != self.replica_id]
        if target is None:
            if not standbys:
                raise HdfsError(f"{self.replica_id} has no live standby to hand over to")
            newest = max(standbys, key=lambda m: (Position.parse(m.applied) if m.applied else Position(0, 0, 0),
                                                 m.replica_id))
            target = newest.replica_id
        elif target not in {m.replica_id for m in standbys}:
            raise HdfsError(f"no live standby {target!r} (live: {sorted(m.replica_id for m in standbys)})")
        await self.rsm.transfer_leadership(target)
        return target

    async def free(self, blocks: list[Any]) -> None:
        for raw in blocks:
            try:
                await self.client.delete_ledger(Block.from_json(raw).ledger_id)
            except ScribaError as exc:  # garbage left behind, not a lost acknowledgement
                log.warning("namenode_free_failed", ledger_id=raw[0], error=str(exc))


def _json(body: Any, status: int = 200, position: Position | None = None) -> web.Response:
    headers = {"X-Scriba-Position": str(position)} if position is not None else None
    return web.json_response(body, status=status, headers=headers)


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- operations ---------------------------------------------------------------------------
async def op_getfilestatus(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    return _json(await nn.read({"q": "status", "path": path}, p))


async def op_liststatus(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    out = await nn.read({"q": "list", "path": path}, p)
    return _json({"FileStatuses": out["FileStatuses"]})


async def op_liststatus_batch(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    out = await nn.read({"q": "list", "path": path, "after": p.text("startafter", ""), "limit": LISTING_LIMIT}, p)
    return _json({"DirectoryListing": {"partialListing": {"FileStatuses": out["FileStatuses"]},
                                       "remainingEntries": out.get("remainingEntries", 0)}})


async def op_getcontentsummary(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    return _json(await nn.read({"q": "summary", "path": path}, p))


async def op_getfilechecksum(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    return _json(await nn.read({"q": "checksum", "path": path}, p))


async def op_gethomedirectory(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    return _json({"Path": f"/user/{p.user}"})


async def op_getserverdefaults(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    return _json({"FsServerDefaults": {"blockSize": Params.BLOCK_SIZE, "bytesPerChecksum": 512,
                                       "writePacketSize": 65536, "replication": 3, "fileBufferSize": 4096,
                                       "encryptDataTransfer": False, "trashInterval": 0, "checksumType": 2,
                                       "keyProviderUri": "", "defaultStoragePolicyId": 7}})


async def op_mkdirs(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    result, pos = await nn.propose(e.Mkdirs(path, p.permission(0o755), p.user, p.group, _now_ms(), user=p.user))
    return _json({"boolean": result}, position=pos)


async def op_rename(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    destination = p.text("destination", "")
    split_path(destination)
    result, pos = await nn.propose(e.Rename(path, destination, _now_ms(), user=p.user))
    return _json({"boolean": result}, position=pos)


async def op_delete(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    result, pos = await nn.propose(e.Delete(path, p.flag("recursive", False), _now_ms(), user=p.user))
    await nn.free(result["freed"])
    return _json({"boolean": result["deleted"]}, position=pos)


async def op_setpermission(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    _, pos = await nn.propose(e.SetPermission(path, p.permission(0o755), user=p.user))
    return web.Response(status=200, headers={"X-Scriba-Position": str(pos)})


async def op_setowner(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    _, pos = await nn.propose(e.SetOwner(path, p.text("owner", "") or None, p.text("group", "") or None, user=p.user))
    return web.Response(status=200, headers={"X-Scriba-Position": str(pos)})


async def op_settimes(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    _, pos = await nn.propose(e.SetTimes(path, p.integer("modificationtime", -1), p.integer("accesstime", -1),
                                        user=p.user))
    return web.Response(status=200, headers={"X-Scriba-Position": str(pos)})


async def op_setreplication(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    result, pos = await nn.propose(e.SetReplication(path, p.integer("replication", 3), user=p.user))
    return _json({"boolean": result}, position=pos)


def _redirect(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    query = {**{k: v for k, v in rq.query.items()}, "data": "true"}
    location = f"{nn.url}{PREFIX}{rq.match_info.get('path', '') and '/' + rq.match_info['path']}?{urlencode(query)}"
    if p.flag("noredirect", False):
        return _json({"Location": location})
    raise web.HTTPTemporaryRedirect(location)


async def op_create(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    if not split_path(path):
        raise IllegalArgumentException("cannot create a file at /")
    if not p.flag("data", False):
        return _redirect(nn, path, p, rq)
    replication, block_size = p.integer("replication", 3), p.integer("blocksize", Params.BLOCK_SIZE)
    result, _ = await nn.propose(e.Create(path, p.flag("overwrite", False), p.permission(0o644), p.user, p.group,
                                          replication, block_size, _now_ms(), user=p.user))
    await nn.free(result["freed"])
    pos = await _upload(nn, path, int(result["file_id"]), replication, block_size, rq)
    return web.Response(status=201, headers={"Location": f"hdfs://{rq.host}{path}", "X-Scriba-Position": str(pos)})


async def op_append(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    if not p.flag("data", False):
        await nn.read({"q": "blocks", "path": path}, p)  # FileNotFoundException before the redirect
        return _redirect(nn, path, p, rq)
    result, _ = await nn.propose(e.Append(path, _now_ms(), user=p.user))
    status = await nn.read({"q": "status", "path": path}, p)
    fs = status["FileStatus"]
    pos = await _upload(nn, path, int(result["file_id"]), fs["replication"], fs["blockSize"], rq)
    return web.Response(status=200, headers={"X-Scriba-Position": str(pos)})


async def _upload(nn: NameNode, path: str, file_id: int, replication: int, block_size: int,
                  rq: web.Request) -> Position:
    writer = BlockWriter(nn.client, replication=replication, block_size=block_size)
    try:
        async for chunk in rq.content.iter_chunked(CHUNK_BYTES):
            for block in await writer.write(chunk):
                await nn.propose(e.AddBlock(path, file_id, block))
        for block in await writer.finish():
            await nn.propose(e.AddBlock(path, file_id, block))
    except BaseException:
        await writer.abort()
        await _recover_lease(nn, path, file_id)
        raise
    _, pos = await nn.propose(e.Complete(path, file_id, _now_ms()))
    return pos


async def _recover_lease(nn: NameNode, path: str, file_id: int) -> None:
    """An upload that failed: close the file with the blocks recorded so far (HDFS's lease
    recovery keeps what reached the datanodes too), so it is not left under construction."""
    try:
        await nn.propose(e.Complete(path, file_id, _now_ms()))
    except Exception as exc:  # a newer writer or a lost active: nothing more to do here
        log.warning("namenode_lease_recovery_failed", path=path, error=repr(exc))


async def op_open(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    out = await nn.read({"q": "blocks", "path": path}, p)
    blocks, size = [Block.from_json(b) for b in out["blocks"]], out["length"]
    offset = p.integer("offset", 0)
    if offset < 0:
        raise IllegalArgumentException(f"Invalid value for webhdfs parameter \"offset\": {offset} < 0")
    if offset > size:
        raise HdfsError(f"Offset={offset} out of the range [0, {size}]; OPEN, path={path}")
    length = p.integer("length", size - offset)
    if length < 0:
        raise IllegalArgumentException(f"Invalid value for webhdfs parameter \"length\": {length} < 0")
    length = min(length, size - offset)
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/octet-stream",
                                                       "Content-Length": str(length)})
    await response.prepare(rq)
    async for piece in read_range(nn.client, blocks, offset, length):
        await response.write(piece)
    await response.write_eof()
    return response


async def op_getfileblocklocations(nn: NameNode, path: str, p: Params, rq: web.Request) -> web.StreamResponse:
    out = await nn.read({"q": "blocks", "path": path}, p)
    blocks, size = [Block.from_json(b) for b in out["blocks"]], out["length"]
    offset, length = p.integer("offset", 0), p.integer("length", size)
    if offset < 0 or length < 0:
        raise IllegalArgumentException(f"Invalid value for webhdfs parameter: offset={offset}, length={length} < 0")
    locations = await block_locations(nn.client, blocks, offset, length)
    return _json({"BlockLocations": {"BlockLocation": locations}})


OPS: Final[dict[tuple[str, str], Handler]] = {
    ("GET", "GETFILESTATUS"): op_getfilestatus,
    ("GET", "LISTSTATUS"): op_liststatus,
    ("GET", "LISTSTATUS_BATCH"): op_liststatus_batch,
    ("GET", "GETCONTENTSUMMARY"): op_getcontentsummary,
    ("GET", "GETFILECHECKSUM"): op_getfilechecksum,
    ("GET", "GETHOMEDIRECTORY"): op_gethomedirectory,
    ("GET", "GETSERVERDEFAULTS"): op_getserverdefaults,
    ("GET", "OPEN"): op_open,
    ("GET", "GETFILEBLOCKLOCATIONS"): op_getfileblocklocations,
    ("PUT", "MKDIRS"): op_mkdirs,
    ("PUT", "RENAME"): op_rename,
    ("PUT", "SETPERMISSION"): op_setpermission,
    ("PUT", "SETOWNER"): op_setowner,
    ("PUT", "SETTIMES"): op_settimes,
    ("PUT", "SETREPLICATION"): op_setreplication,
    ("PUT", "CREATE"): op_create,
    ("POST", "APPEND"): op_append,
    ("DELETE", "DELETE"): op_delete,
}


def remote_error(exc: BaseException) -> web.Response:
    """WebHDFS's ``RemoteException`` body and status for any failure."""
    if isinstance(exc, HdfsError):
        error = exc
    elif isinstance(exc, RsmNotLeaderError | ReplicaStoppedError):
        error = StandbyException(f"Operation not served by this namenode now: {exc}")
    elif isinstance(exc, CommandOutcomeUnknownError | ScribaError):
        error = RetriableException(str(exc))
    else:
        body = {"RemoteException": {"exception": "RuntimeException", "javaClassName": "java.lang.RuntimeException",
                                    "message": f"{type(exc).__name__}: {exc}"}}
        return web.json_response(body, status=500)
    return web.json_response(error.remote_exception(), status=error.http_status)


async def _hadoop_json_compat(rq: web.BaseRequest, response: web.StreamResponse) -> None:
    """JSON answers to Hadoop's own Java client go without ``Content-Type``.

    Hadoop's ``WebHdfsFileSystem.jsonParse`` checks a Content-Type with JAX-RS's
    ``MediaType.valueOf``, whose implementation the shaded ``hadoop-client-runtime``
    (what Spark ships) lacks: every JSON answer, errors included, then fails with
    ``ClassNotFoundException: ...jersey.internal.RuntimeDelegateImpl``. Without the
    header the check is skipped and the body parsed as JSON. Other clients (HdfsCLI,
    fsspec, curl) get the header as usual.
    """
    if rq.headers.get("User-Agent", "").startswith("Java/") and response.content_type == "application/json":
        del response.headers["Content-Type"]


def make_app(nn: NameNode) -> web.Application:
    async def webhdfs(rq: web.Request) -> web.StreamResponse:
        try:
            params = Params(rq.query)
            path = "/" + rq.match_info.get("path", "")
            split_path(path)
            handler = OPS.get((rq.method, params.op))
            if handler is None:
                raise IllegalArgumentException(f"Invalid value for webhdfs parameter \"op\": {params.op!r} with "
                                               f"HTTP {rq.method} is not supported")
            return await handler(nn, path if path == "/" else path.rstrip("/"), params, rq)
        except web.HTTPException:
            raise
        except Exception as exc:
            if not isinstance(exc, HdfsError):
                log.warning("webhdfs_failed", op=rq.query.get("op"), path=rq.path, error=repr(exc))
            return remote_error(exc)

    async def status(rq: web.Request) -> web.StreamResponse:
        return _json({"id": nn.replica_id, "role": nn.role, "txid": nn.machine.ns.txid, "url": nn.url,
                      "rsm": nn.rsm.status()})

    async def digest(rq: web.Request) -> web.StreamResponse:
        try:
            return _json(await nn.read({"q": "digest"}, Params(rq.query)))
        except Exception as exc:
            return remote_error(exc)

    async def transfer(rq: web.Request) -> web.StreamResponse:
        try:
            user = Params(rq.query).user
            if user != perm.SUPERUSER:  # HDFS: haadmin needs the superuser
                raise AccessControlException(f"Access denied for user {user}. Superuser privilege is required")
            target = rq.query.get("to") or None
            return _json({"active": await nn.transfer(target), "previous": nn.replica_id})
        except Exception as exc:
            return remote_error(exc)

    app = web.Application(client_max_size=1024 ** 3)
    app.on_response_prepare.append(_hadoop_json_compat)
    app.router.add_route("*", PREFIX, webhdfs)
    app.router.add_route("*", PREFIX + "/{path:.*}", webhdfs)
    app.router.add_get("/scriba/status", status)
    app.router.add_get("/scriba/digest", digest)
    app.router.add_post("/scriba/ha/transfer", transfer)
    return app


async def serve(nn: NameNode, host: str, port: int, tls: LoadedTls | None = None) -> web.AppRunner:
    """WebHDFS on ``host:port``; ``tls``: HTTPS only (mutual TLS: client and admin
    allow-lists checked before any handler)."""
    app = make_app(nn)
    if tls is not None and tls.config.require_client_cert:
        app.middlewares.append(identity_middleware(tls, (Role.CLIENT, Role.ADMIN)))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=site_ssl(tls)).start()
    nn.url = f"{'https' if tls is not None else 'http'}://{host}:{port}"
    return runner
