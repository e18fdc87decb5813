"""TLS for grpc.aio servers and channels: ports, channels and per-call identity checks.

:func:`bind` adds a server's port, secure when a :class:`~scriba.tls.LoadedTls` is
given (never insecure then). :func:`open_channel` dials the same way. With mutual
TLS, :func:`guard_handlers` wraps method handlers (or :class:`IdentityInterceptor`
wraps whatever a server registered) so that every call first checks the peer's
certificate identities against the allow-lists of the roles the server admits
(:func:`scriba.tls.authorize`); a refused call ends with ``PERMISSION_DENIED`` and a
message naming the identities, before the handler runs. Streams are checked once,
when they open.

Import this module only after ``scriba.grpc_runtime.apply_defaults()`` (it imports gRPC).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from scriba.errors import ConfigError, UnauthorizedError
from scriba.tls import LoadedTls, Role, authorize, identities_from_grpc

Check = Callable[[Any], Awaitable[None]]


def bind(server: grpc.aio.Server, address: str, tls: LoadedTls | None) -> int:
    """Add ``address`` to ``server`` (TLS when ``tls``); the bound port, 0 if it could not bind."""
    try:
        if tls is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, tls.grpc_server_credentials()))
    except RuntimeError:  # gRPC says only "Failed to bind"
        return 0


def open_channel(address: str, tls: LoadedTls | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """A grpc.aio channel to ``address``: TLS (server name verified) when ``tls``, else plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(
        address, tls.grpc_channel_credentials(), options=[*options, *tls.grpc_channel_options()]
    )


def identity_check(tls: LoadedTls, roles: Iterable[Role]) -> Check:
    """A per-call check: abort with PERMISSION_DENIED unless the peer is admitted."""
    config = tls.config
    wanted = tuple(roles)

    async def check(context: Any) -> None:
        identities = identities_from_grpc(context.auth_context())
        try:
            authorize(config, identities, wanted)
        except UnauthorizedError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"unauthorized: {exc}")

    return check


def guard(handler: Any, check: Check) -> Any:
    """``handler`` (an ``RpcMethodHandler``) with ``check`` run before its behaviour."""
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        inner = getattr(handler, kind)
        if inner is not None:
            return handler._replace(**{kind: _guarded(inner, check)})
    raise ConfigError(f"cannot guard gRPC handler {handler!r}: no behaviour")


def guard_handlers(handlers: Mapping[str, Any], check: Check) -> dict[str, Any]:
    return {name: guard(h, check) for name, h in handlers.items()}


def _guarded(inner: Callable[..., Any], check: Check) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(context)
            async for item in inner(request, context):
                yield item

        return stream

    async def call(request: Any, context: Any) -> Any:
        await check(context)
        return await inner(request, context)

    return call


class IdentityInterceptor(grpc.aio.ServerInterceptor):
    """Guards every method a grpc.aio server serves (for servers built by generated code)."""

    def __init__(self, check: Check) -> None:
        self._check = check

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return guard(handler, self._check)
