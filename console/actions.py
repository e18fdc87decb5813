"""Operator actions from the console: decommission a bookie, ask for an audit, move an RSM
group's leader — only when the console was started with ``--allow-actions``.

Each action is two POSTs of a JSON body to ``/api/actions/<kind>``:

1. the arguments alone -> ``{"confirm": TOKEN, "summary": ..., "expires_in_s": ...}``;
   nothing is done yet (the page shows the summary and asks the operator to confirm);
2. the same arguments with ``"confirm": TOKEN`` -> the action runs,
   ``{"done": true, "kind": ..., "result": {...}}``.

A token is random, bound to (kind, arguments, actor), good once and for
:data:`CONFIRM_TTL_S`; at most :data:`PENDING_MAX` wait (the oldest go first). Like a CSRF
token it proves the second request comes from someone who read the first answer; and a
cross-site page cannot make the first one either: the body must be ``application/json``
(a form cannot send it without a CORS preflight, which the console never grants) and an
``Origin`` header, when sent, must be the console's own.

Who may act is one function, :data:`Authorize` (the request -> the acting identity, or
None). With mutual TLS (``--tls-*`` with client certificates, #21) it is
:func:`admin_certificates`: the identities of the caller's certificate, if they are on the
admin allow-list (the console's TLS middleware already refuses every other certificate;
this check stands on its own); without, :func:`any_caller` lets whoever reaches the
console act once ``--allow-actions`` is on (it listens on 127.0.0.1 by default).

What each action does (the same library calls as the shell verbs):

- ``decommission`` ``{"bookie_id"}``: ``autorecovery.commands.start_decommission`` then
  ``mark_bookie(..., DECOMMISSION)`` — as ``scriba shell decommission --mark-only``: the
  replication workers copy the marked fragments off the bookie (a web request does not
  run a drain of unbounded length);
- ``audit`` ``{"full": bool}``: ``request_audit`` (``scriba shell audit-now``), which the
  elected auditor runs;
- ``transfer-leadership`` ``{"group": "NS/NAME", "replica_id"}``: the group's leader, reached
  through ``RsmClient.transfer_leadership``, hands over; answers once the target leads.

:class:`Confirmations` is the I/O-free token book (clock and token source passed in).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from scriba.console.views import Model
from scriba.errors import BadRequestError, ScribaError, UnauthorizedError
from scriba.ids import BookieId
from scriba.meta.store import MetadataStore
from scriba.tls import LoadedTls, Role, TlsConfig, identities_from_peercert, refusal

CONFIRM_TTL_S: Final = 120.0
PENDING_MAX: Final = 64
ACTION_TIMEOUT_S: Final = 60.0
KINDS: Final = ("decommission", "audit", "transfer-leadership")


class ActionRefusedError(UnauthorizedError):
    """The console will not act: actions are off, the caller may not act, or the confirmation
    does not hold (unknown, used, expired, or for other arguments). Answered as HTTP 403."""


class ActionFailedError(ScribaError):
    """The action was tried and failed (the store or the group said no): HTTP 409, with why."""


Authorize = Callable[[web.Request], str | None]
"""The acting identity for a request, or None if it may not act (the hook #21 fills in)."""


def any_caller(request: web.Request) -> str | None:
    """Without client certificates: whoever reaches a console started with ``--allow-actions``
    acts, as "operator" (the console listens on 127.0.0.1 by default)."""
    return "operator"


def admin_certificates(tls: LoadedTls) -> Authorize:
    """Under mutual TLS (#21): the caller acts as the identities of its certificate when they are
    on the admin allow-list (``--tls-allow admin=...``); anyone else may not act."""

    def authorize(request: web.Request) -> str | None:
        peercert = request.transport.get_extra_info("peercert") if request.transport is not None else None
        if refusal(tls, peercert, (Role.ADMIN,)) is not None:
            return None
        return ",".join(sorted(identities_from_peercert(peercert))) or None

    return authorize


@dataclass(frozen=True, slots=True)
class ActionRequest:
    kind: str
    args: tuple[tuple[str, Any], ...]  # sorted, checked

    @classmethod
    def parse(cls, kind: str, body: Mapping[str, Any]) -> ActionRequest:
        if kind not in KINDS:
            raise BadRequestError(f"unknown action {kind!r}: one of {', '.join(KINDS)}")
        args: dict[str, Any]
        if kind == "decommission":
            args = {"bookie_id": _text(body, "bookie_id")}
        elif kind == "audit":
            full = body.get("full", False)
            if not isinstance(full, bool):
                raise BadRequestError(f"audit: full must be true or false, not {full!r}")
            args = {"full": full}
        else:
            group = _text(body, "group")
            if "/" not in group:
                raise BadRequestError(f"transfer-leadership: group {group!r}: expected NAMESPACE/NAME")
            args = {"group": group, "replica_id": _text(body, "replica_id")}
        return cls(kind, tuple(sorted(args.items())))

    @property
    def arguments(self) -> dict[str, Any]:
        return dict(self.args)

    def summary(self) -> str:
        a = self.arguments
        if self.kind == "decommission":
            return (f"Decommission bookie {a['bookie_id']}: no new ledger will use it, every fragment on it is "
                    "marked and the replication workers copy it elsewhere.")
        if self.kind == "audit":
            return "Ask the elected auditor for a " + ("full (every entry read) " if a["full"] else "") + "check now."
        return f"Move the leadership of {a['group']} to replica {a['replica_id']}."


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise BadRequestError(f"{name}: a non-empty string of at most 256 characters is required")
    return value.strip()


@dataclass(frozen=True, slots=True)
class _Pending:
    request: ActionRequest
    actor: str
    expires_s: float


class Confirmations:
    """Tokens issued for an action and redeemed once (I/O-free: clock and token source passed in)."""

    def __init__(self, *, ttl_s: float = CONFIRM_TTL_S, pending_max: int = PENDING_MAX,
                 token: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> None:
        self.ttl_s = ttl_s
        self.pending_max = pending_max
        self._token = token
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def issue(self, request: ActionRequest, actor: str, now_s: float) -> str:
        self._expire(now_s)
        while len(self._pending) >= self.pending_max:
            self._pending.popitem(last=False)
        token = self._token()
        self._pending[token] = _Pending(request, actor, now_s + self.ttl_s)
        return token

    def redeem(self, token: str, request: ActionRequest, actor: str, now_s: float) -> None:
        """Use ``token`` for ``request`` by ``actor``, or raise :class:`ActionRefusedError` saying why."""
        self._expire(now_s)
        pending = self._pending.pop(token, None)  # good once, even when it does not match
        if pending is None:
            raise ActionRefusedError("confirmation token unknown, already used or expired: ask again")
        if pending.request != request or pending.actor != actor:
            raise ActionRefusedError("confirmation token was issued for another action or caller: ask again")

    def _expire(self, now_s: float) -> None:
        for token in [t for t, p in self._pending.items() if p.expires_s <= now_s]:
            del self._pending[token]


Connect = Callable[[str], Awaitable[MetadataStore]]


class Actions:
    """Checks actions against what the console shows (``model``), then runs confirmed ones
    against the metadata store at ``uri`` (a store connection per action)."""

    def __init__(self, uri: str, connect: Connect, model: Model, *, authorize: Authorize = any_caller,
                 clock: Callable[[], float] = time.monotonic, rsm_tls: TlsConfig | None = None) -> None:
        """``rsm_tls``: reach RSM replicas over TLS with this client certificate (an admin one)."""
        self.uri = uri
        self._rsm_tls = rsm_tls
        self._connect = connect
        self._model = model
        self.authorize = authorize
        self._clock = clock
        self.confirmations = Confirmations()

    def actor(self, request: web.Request) -> str:
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            raise ActionRefusedError(f"cross-origin action refused (Origin {origin!r})")
        actor = self.authorize(request)
        if actor is None:
            raise ActionRefusedError("this caller may not act on the cluster (not an admin identity)")
        return actor

    def check(self, request: ActionRequest) -> None:
        """Refuse (400) an action on a bookie or replica the console does not know of."""
        a = request.arguments
        if request.kind == "decommission" and a["bookie_id"] not in {b["bookie_id"] for b in self._model.bookies()}:
            raise BadRequestError(f"decommission: no bookie {a['bookie_id']!r} is known")
        if request.kind == "transfer-leadership":
            members = self._group_members(a["group"])
            if a["replica_id"] not in members:
                raise BadRequestError(f"transfer-leadership: {a['group']} has no live replica {a['replica_id']!r}"
                                      f" (live: {', '.join(sorted(members)) or 'none'})")

    def _group_members(self, group: str) -> dict[str, str]:
        """Replica id -> service address of the group's registered replicas."""
        return {rid: address for (g, rid), address in self._model.rsm_targets().items() if g == group}

    async def handle(self, request: ActionRequest, actor: str, token: str | None) -> dict[str, Any]:
        now = self._clock()
        self.check(request)
        if token is None:
            issued = self.confirmations.issue(request, actor, now)
            return {"confirm": issued, "kind": request.kind, "arguments": request.arguments,
                    "summary": request.summary(), "expires_in_s": self.confirmations.ttl_s}
        self.confirmations.redeem(token, request, actor, now)
        try:
            async with asyncio.timeout(ACTION_TIMEOUT_S):
                result = await self._run(request)
        except TimeoutError:
            raise ActionFailedError(f"{request.kind}: no answer within {ACTION_TIMEOUT_S:.0f} s") from None
        except BadRequestError:
            raise
        except ScribaError as exc:
            raise ActionFailedError(f"{request.kind} failed: {type(exc).__name__}: {exc}") from exc
        return {"done": True, "kind": request.kind, "actor": actor, "arguments": request.arguments,
                "result": result}

    async def _run(self, request: ActionRequest) -> dict[str, Any]:
        a = request.arguments
        if request.kind == "transfer-leadership":
            return await self._transfer(a["group"], a["replica_id"])
        from scriba.autorecovery import commands
        from scriba.autorecovery.records import Reason

        store = await self._connect(self.uri)
        try:
            if request.kind == "audit":
                return {"sequence": await commands.request_audit(store, full=a["full"]), "full": a["full"]}
            bookie = BookieId(a["bookie_id"])
            record = await commands.start_decommission(store, bookie)
            marked = await commands.mark_bookie(store, bookie, Reason.DECOMMISSION)
            return {"bookie_id": bookie, "state": record.state.value, "ledgers_marked": marked}
        finally:
            await store.close()

    async def _transfer(self, group: str, replica_id: str) -> dict[str, Any]:
        from scriba.rsm.remote import RsmClient

        addresses = [a for a in self._group_members(group).values() if a]
        if not addresses:
            raise BadRequestError(f"no live replicas of {group}")
        client = RsmClient(addresses, timeout_s=ACTION_TIMEOUT_S / 2, tls=self._rsm_tls)
        try:
            await client.transfer_leadership(replica_id)
        finally:
            await client.close()
        return {"group": group, "leader": replica_id}
