"""The Toxiproxy HTTP API of the fault proxy: requests, routes, proxies' state.

Routes (Toxiproxy's): ``GET /version``, ``POST /reset`` (every toxic removed, every
proxy enabled), ``GET|POST /proxies``, ``POST /populate``, ``GET|POST|PATCH|DELETE
/proxies/{name}``, ``GET|POST /proxies/{name}/toxics``, ``GET|POST|PATCH|DELETE
/proxies/{name}/toxics/{toxic}``. A refused request is an ``ApiError`` whose code is the
HTTP status (its message in the JSON body). HTTP/1.1 with ``Content-Length`` bodies
only (no chunked bodies), bounded request size; keep-alive as the client asks.

Bounds: proxies, toxics per proxy, API body size (``FaultProxyConfig``). Listen
addresses are loopback only unless ``loopback_only=False``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scriba.config import parse_host_port
from scriba.errors import ConfigError
from scriba.log import get_logger
from scriba.testing.proxy_links import Proxy
from scriba.testing.toxics import ApiError, Toxic, parse_toxic

if TYPE_CHECKING:
    from scriba.testing.faults import FaultProxyConfig

__all__ = ["VERSION", "ApiState", "ToxiproxyApi", "http_response", "is_loopback", "read_request"]

log = get_logger(__name__)

VERSION = "2.9.0-scriba"


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: tuple[str, ...]
    body: Any
    keep_alive: bool


_REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error"}


def http_response(status: int, payload: Any, keep_alive: bool) -> bytes:
    body = b"" if payload is None else json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


async def read_request(reader: asyncio.StreamReader, body_max: int) -> _Request | None:
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ApiError(400, "malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for _ in range(100):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        key, _, value = raw.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    else:
        raise ApiError(400, "too many headers")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ApiError(400, "chunked bodies are not supported; send Content-Length")
    length = int(headers.get("content-length", "0") or 0)
    if length < 0 or length > body_max:
        raise ApiError(413, f"body of {length} bytes exceeds {body_max}")
    raw_body = await reader.readexactly(length) if length else b""
    try:
        body = json.loads(raw_body) if raw_body.strip() else None
    except ValueError:
        raise ApiError(400, "body is not valid JSON") from None
    path = urllib.parse.urlsplit(target).path
    segments = tuple(urllib.parse.unquote(s) for s in path.strip("/").split("/") if s)
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return _Request(method.upper(), segments, body, keep_alive)


@dataclass(slots=True)
class ApiState:
    config: FaultProxyConfig
    rng: random.Random
    proxies: dict[str, Proxy] = field(default_factory=dict)
    next_uid: int = 1

    def uid(self) -> int:
        self.next_uid += 1
        return self.next_uid


class ToxiproxyApi:
    """Routes of the Toxiproxy HTTP API over :class:`ApiState`; runs on the server's loop."""

    def __init__(self, state: ApiState) -> None:
        self.state = state

    async def handle(self, req: _Request) -> tuple[int, Any]:
        p, m = req.path, req.method
        if p == ("version",) and m == "GET":
            return 200, {"version": VERSION}
        if p == ("reset",) and m == "POST":
            await self.reset()
            return 204, None
        if p == ("proxies",):
            if m == "GET":
                return 200, {n: px.to_json() for n, px in self.state.proxies.items()}
            if m == "POST":
                return 201, (await self.create_proxy(req.body)).to_json()
        if p == ("populate",) and m == "POST":
            return 201, {"proxies": await self.populate(req.body)}
        if len(p) >= 2 and p[0] == "proxies":
            return await self._proxy_routes(self._proxy(p[1]), p[2:], m, req.body)
        if p and p[0] in ("version", "reset", "proxies", "populate"):
            raise ApiError(405, f"{m} not allowed on /{'/'.join(p)}")
        raise ApiError(404, f"no route /{'/'.join(p)}")

    async def _proxy_routes(self, proxy: Proxy, rest: tuple[str, ...], m: str, body: Any) -> tuple[int, Any]:
        if rest == ():
            if m == "GET":
                return 200, proxy.to_json()
            if m in ("POST", "PATCH"):
                return 200, (await self.update_proxy(proxy, body)).to_json()
            if m == "DELETE":
                await proxy.disable()
                del self.state.proxies[proxy.name]
                return 204, None
        elif rest == ("toxics",):
            if m == "GET":
                return 200, [t.to_json() for t in proxy.toxics]
            if m == "POST":
                return 200, self.add_toxic(proxy, body).to_json()
        elif len(rest) == 2 and rest[0] == "toxics":
            index = self._toxic_index(proxy, rest[1])
            if m == "GET":
                return 200, proxy.toxics[index].to_json()
            if m in ("POST", "PATCH"):
                old = proxy.toxics[index]
                new = parse_toxic({**(body or {}), "name": old.name, "type": old.type}, self.state.uid(), old)
                proxy.toxics[index] = new
                proxy.toxics_changed()
                return 200, new.to_json()
            if m == "DELETE":
                del proxy.toxics[index]
                proxy.toxics_changed()
                log.info("toxic_removed", proxy=proxy.name, toxic=rest[1])
                return 204, None
        else:
            raise ApiError(404, f"no route under /proxies/{proxy.name}")
        raise ApiError(405, f"{m} not allowed here")

    def _proxy(self, name: str) -> Proxy:
        proxy = self.state.proxies.get(name)
        if proxy is None:
            raise ApiError(404, f"proxy not found: {name}")
        return proxy

    @staticmethod
    def _toxic_index(proxy: Proxy, name: str) -> int:
        for i, toxic in enumerate(proxy.toxics):
            if toxic.name == name:
                return i
        raise ApiError(404, f"toxic not found: {name}")

    def _check_address(self, text: Any, what: str, listen: bool) -> str:
        if not isinstance(text, str):
            raise ApiError(400, f"{what} must be a HOST:PORT string")
        try:
            host, port = parse_host_port(text)
        except ConfigError as exc:
            raise ApiError(400, f"{what}: {exc}") from None
        if listen and self.state.config.loopback_only and not is_loopback(host):
            raise ApiError(400, f"{what} {text!r}: this proxy listens on loopback addresses only")
        if not listen and port == 0:
            raise ApiError(400, f"{what} {text!r}: port 0")
        return text

    async def create_proxy(self, body: Any) -> Proxy:
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
            raise ApiError(400, "proxy needs a name")
        name = body["name"]
        if "/" in name or len(name) > 200:
            raise ApiError(400, f"invalid proxy name {name!r}")
        if name in self.state.proxies:
            raise ApiError(409, f"proxy already exists: {name}")
        if len(self.state.proxies) >= self.state.config.proxies_max:
            raise ApiError(400, f"at most {self.state.config.proxies_max} proxies")
        upstream = self._check_address(body.get("upstream"), "upstream", listen=False)
        listen = self._check_address(body.get("listen", "127.0.0.1:0"), "listen", listen=True)
        proxy = Proxy(name, listen, upstream, self.state.config, self.state.rng)
        if body.get("enabled", True):
            await proxy.enable()
        self.state.proxies[name] = proxy
        return proxy

    async def update_proxy(self, proxy: Proxy, body: Any) -> Proxy:
        if not isinstance(body, dict):
            raise ApiError(400, "proxy update must be a JSON object")
        relisten = False
        if "upstream" in body:
            proxy.upstream = self._check_address(body["upstream"], "upstream", listen=False)
        if "listen" in body and body["listen"] != proxy.listen:
            proxy.listen = self._check_address(body["listen"], "listen", listen=True)
            relisten = True
        enabled = body.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ApiError(400, "enabled must be true or false")
        if not enabled or relisten:
            await proxy.disable()
        if enabled:
            await proxy.enable()
        return proxy

    def add_toxic(self, proxy: Proxy, body: Any) -> Toxic:
        toxic = parse_toxic(body, self.state.uid())
        if any(t.name == toxic.name for t in proxy.toxics):
            raise ApiError(409, f"toxic already exists: {toxic.name}")
        if len(proxy.toxics) >= self.state.config.toxics_per_proxy_max:
            raise ApiError(400, f"at most {self.state.config.toxics_per_proxy_max} toxics per proxy")
        proxy.toxics.append(toxic)
        proxy.toxics_changed()
        log.info("toxic_added", proxy=proxy.name, toxic=toxic.name, type=toxic.type, stream=toxic.stream)
        return toxic

    async def populate(self, body: Any) -> list[dict[str, Any]]:
        if not isinstance(body, list):
            raise ApiError(400, "populate takes a JSON list of proxies")
        out = []
        for item in body:
            if isinstance(item, dict) and item.get("name") in self.state.proxies:
                old = self.state.proxies.pop(item["name"])
                await old.disable()
            out.append((await self.create_proxy(item)).to_json())
        return out

    async def reset(self) -> None:
        for proxy in self.state.proxies.values():
            proxy.toxics.clear()
            proxy.toxics_changed()
            await proxy.enable()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


