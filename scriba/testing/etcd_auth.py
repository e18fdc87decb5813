"""Turn on etcd's authentication with a user whose role reaches one key prefix only.

What an operator does with ``etcdctl user add / role add / role grant-permission
--prefix / user grant-role / auth enable``, done over etcd's gRPC Auth API so tests and
the sandbox need no etcdctl: a ``root`` user (required by ``auth enable``) and a user
whose role may read and write ``PREFIX/`` and nothing else.
"""

from __future__ import annotations

import grpc
import grpc.aio
from aetcd import rpc  # type: ignore[import-untyped]

from scriba.tls import TlsConfig

TIMEOUT_S = 10.0


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """``[PREFIX/, PREFIX0)``: every key Scriba keeps under ``prefix`` (EtcdStore's root)."""
    start = (prefix.strip("/") + "/").encode()
    return start, start[:-1] + b"0"  # '0' follows '/' in byte order


async def enable_auth(
    address: str, tls: TlsConfig | None, *, root_password: str, user: str, password: str, prefix: str
) -> None:
    """On the etcd at ``address`` (``HOST:PORT``): root, a role for ``prefix``, ``user``; auth on."""
    if tls is None:
        channel = grpc.aio.insecure_channel(address)
    else:
        loaded = tls.load()
        channel = grpc.aio.secure_channel(address, loaded.grpc_channel_credentials(), loaded.grpc_channel_options())
    role = f"{user}-role"
    key, range_end = prefix_range(prefix)
    try:
        auth = rpc.AuthStub(channel)
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=root_password), timeout=TIMEOUT_S)
        try:
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if "already" not in (exc.details() or ""):
                raise
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=TIMEOUT_S)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name=role), timeout=TIMEOUT_S)
        await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(
            name=role, perm=rpc.Permission(permType=rpc.Permission.READWRITE, key=key, range_end=range_end)),
            timeout=TIMEOUT_S)
        await auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password), timeout=TIMEOUT_S)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role=role), timeout=TIMEOUT_S)
        await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=TIMEOUT_S)
    finally:
        await channel.close()
