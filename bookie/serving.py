"""What the bookie's servicer shares with the bookie around it and with the binary path.

``ServingState``: whether the bookie serves (registered at least once) and accepts adds
(registered now, not shutting down); the servicer refuses adds READ_ONLY otherwise.
``AddCredit``: what bounds one connection's adds (a gRPC add stream's bookkeeping, or a
binary connection). The caller of a request: its certificate identities come from the
gRPC call's context, or, for the binary path, from ``PeerIdentities`` taken once per
connection (``caller_identities`` reads either); reads of a ledger with a password
check them against the admin allow-list. ``error_status``: the one mapping from an
exception raised while serving to the wire status and message it is answered with.
``BOOKIE_CALLERS``: who may call a bookie at all under mutual TLS.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from scriba.bookie.add_decoding import wire_status
from scriba.errors import ScribaError, Status
from scriba.tls import Role, identities_from_grpc

__all__ = [
    "BOOKIE_CALLERS", "AddCredit", "PeerIdentities", "ServingState", "caller_identities", "error_status",
]

_WIRE_STATUS_MAX: Final = int(Status.UNAVAILABLE)
_INTERNAL: Final[Any] = int(Status.INTERNAL)

BOOKIE_CALLERS: Final = (Role.CLIENT, Role.BOOKIE, Role.ADMIN)  # who may call a bookie's gRPC service


def error_status(exc: BaseException) -> tuple[int, str]:
    """The wire status and message for an exception raised while serving a request."""
    if isinstance(exc, ScribaError):
        code = int(exc.status)
        message = str(exc) or type(exc).__name__
        if code > _WIRE_STATUS_MAX:
            message = f"{type(exc).__name__}: {message}"
        return wire_status(code), message
    return _INTERNAL, f"{type(exc).__name__}: {exc}"


class PeerIdentities:
    """A caller's certificate identities, known before the call (the binary path takes
    them once per connection; a gRPC call's come from its context)."""

    __slots__ = ("identities",)

    def __init__(self, identities: frozenset[str]) -> None:
        self.identities = identities


def caller_identities(context: Any) -> frozenset[str]:
    """The certificate identities of a call's peer: a gRPC context, ``PeerIdentities``
    or None (no identities)."""
    if context is None:
        return frozenset()
    if isinstance(context, PeerIdentities):
        return context.identities
    return identities_from_grpc(context.auth_context())


class AddCredit(Protocol):
    """What bounds one connection's adds: the bytes accepted and not yet answered."""

    inflight_bytes: int


class ServingState:
    """What the servicer needs to know about the bookie around it."""

    __slots__ = ("accepting_adds", "bookie_id", "shutting_down", "started")

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.started = False  # registered at least once: the bookie serves
        self.accepting_adds = False  # registered now and not shutting down
        self.shutting_down = False


