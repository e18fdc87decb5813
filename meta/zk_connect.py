"""kazoo's connection with every connect attempt bounded well below the session timeout.

kazoo, like ZooKeeper's Java client, gives one connect attempt the session timeout
divided by the number of servers: with one server, the whole session timeout. A
server that accepts the connection and does not answer (one still loading after a
restart, a half-open link through a middlebox) then holds the attempt until the very
session the client came back to keep has expired: a restarted server starts its
sessions' clocks again when it loads them, so a client that reconnects within the
session timeout of that moment keeps its session, its ephemerals and its watches.

Here an attempt (the TCP connect and the wait for the server's answer to ``Connect``)
lasts at most the session timeout divided by ``max(servers, ATTEMPTS_PER_SESSION_MIN)``,
so at least three attempts fit in a session timeout. Once connected, kazoo's own read
timeout (two thirds of the negotiated session timeout) applies, unchanged.
"""

from __future__ import annotations

from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Connect

__all__ = [
    "ATTEMPTS_PER_SESSION_MIN",
    "BoundedConnectHandler",
    "connect_attempt_s",
    "kazoo_client",
]

ATTEMPTS_PER_SESSION_MIN: Final = 3


def connect_attempt_s(session_timeout_s: float, servers: int) -> float:
    """How long one connect attempt may last."""
    return session_timeout_s / max(servers, ATTEMPTS_PER_SESSION_MIN)


class BoundedConnectHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler whose dials give up after ``attempt_s`` (a subclass that
    dials differently, as ``zk+tls://``'s does, passes its timeout through :meth:`bound`)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempt_s = float("inf")  # set by kazoo_client once the servers are known

    def bound(self, timeout: float | None) -> float:
        """kazoo's timeout for a dial, bounded by the attempt's."""
        return self.attempt_s if timeout is None else min(timeout, self.attempt_s)

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = self.bound(kwargs.get("timeout"))
        return super().create_connection(*args, **kwargs)


class _BoundedConnection(ConnectionHandler):  # type: ignore[misc]
    """kazoo's connection loop, waiting at most ``attempt_s`` for the answer to ``Connect``."""

    def __init__(self, client: KazooClient, retry: Any, attempt_s: float, **kwargs: Any) -> None:
        super().__init__(client, retry, **kwargs)
        self.attempt_s = attempt_s

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        if isinstance(request, Connect):
            timeout = min(timeout, self.attempt_s)
        return super()._invoke(timeout, request, xid)


def kazoo_client(*, hosts: str, session_timeout_s: float, **options: Any) -> KazooClient:
    """A new (not started) ``KazooClient`` whose connect attempts are bounded as this module
    says; a ``handler`` among ``options`` must be a :class:`BoundedConnectHandler`."""
    handler = options.pop("handler", None) or BoundedConnectHandler()
    if not isinstance(handler, BoundedConnectHandler):
        raise TypeError(f"kazoo_client needs a BoundedConnectHandler, not {type(handler).__name__}")
    client = KazooClient(hosts=hosts, timeout=session_timeout_s, handler=handler, **options)
    handler.attempt_s = connect_attempt_s(session_timeout_s, len(client.hosts))
    old = client._connection
    client._connection = _BoundedConnection(
        client,
        old.retry_sleeper,
        handler.attempt_s,
        logger=old.logger,
        sasl_options=old.sasl_options,
    )
    return client
