"""Toxics: the faults a link of the fault proxy applies, as the Toxiproxy API shows them.

A toxic has a name, a type, a stream direction (``upstream``: client -> server,
``downstream``: server -> client), a ``toxicity`` (the chance, rolled once per link when
the toxic reaches it, that it applies there) and integer attributes. Types (Toxiproxy's
names and units):
- ``latency {latency, jitter}`` ms, per chunk, measured from its arrival, order kept;
- ``bandwidth {rate}`` KB/s (1 KB = 1000 bytes);
- ``slow_close {delay}`` ms before the EOF is passed on;
- ``timeout {timeout}`` ms: no data passes; 0 holds data until the toxic is
  removed (a blackhole; held data is then delivered, as TCP would after a
  partition heals — real Toxiproxy drops it instead), > 0 also closes the
  connection that long after the toxic reached it;
- ``reset_peer {timeout}`` ms: the first chunk after the toxic arrived is
  swallowed and, ``timeout`` later, both sockets are reset (``SO_LINGER`` 0);
- ``slicer {average_size, size_variation, delay}`` bytes, bytes, microseconds;
- ``limit_data {bytes}``: the connection closes once that many bytes have passed.

:func:`parse_toxic` validates a body of the API (create, or update of an existing
toxic) and refuses bad input with ``ApiError(400)``; every attribute is bounded by
``ATTRIBUTE_MAX``. Each version of a toxic gets a new ``uid``, so links re-arm it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scriba.errors import ScribaError

__all__ = ["ATTRIBUTE_MAX", "STREAMS", "TOXIC_ATTRIBUTES", "ApiError", "Toxic", "parse_toxic"]

STREAMS = ("upstream", "downstream")
ATTRIBUTE_MAX = 3_600_000_000  # one hour in microseconds: an upper bound for every attribute
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}


class ApiError(ScribaError):
    """An API request the proxy refuses; ``code`` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Toxic:
    """One toxic as the API shows it. ``uid`` changes on every update (links re-arm it)."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]
    uid: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def parse_toxic(body: Any, uid: int, existing: Toxic | None = None) -> Toxic:
    """Validate a toxic body (create, or update of ``existing``); ApiError(400) on bad input."""
    if not isinstance(body, dict):
        raise ApiError(400, "toxic body must be a JSON object")
    base = existing.to_json() if existing is not None else {"stream": "downstream", "toxicity": 1.0}
    kind = body.get("type", base.get("type"))
    if kind not in TOXIC_ATTRIBUTES:
        raise ApiError(400, f"invalid toxic type {kind!r}: one of {sorted(TOXIC_ATTRIBUTES)}")
    stream = body.get("stream", base["stream"])
    if stream not in STREAMS:
        raise ApiError(400, f"invalid stream {stream!r}: upstream or downstream")
    toxicity = body.get("toxicity", base["toxicity"])
    if not isinstance(toxicity, int | float) or isinstance(toxicity, bool) or not 0.0 <= toxicity <= 1.0:
        raise ApiError(400, f"toxicity {toxicity!r} must be a number in [0, 1]")
    name = body.get("name") or (existing.name if existing else f"{kind}_{stream}")
    if not isinstance(name, str) or "/" in name or len(name) > 200:
        raise ApiError(400, f"invalid toxic name {name!r}")
    attributes = dict(existing.attributes) if existing is not None else dict.fromkeys(TOXIC_ATTRIBUTES[kind], 0)
    given = body.get("attributes") or {}
    if not isinstance(given, dict):
        raise ApiError(400, "attributes must be a JSON object")
    for key, value in given.items():
        if key not in TOXIC_ATTRIBUTES[kind]:
            raise ApiError(400, f"{kind} has no attribute {key!r}: {list(TOXIC_ATTRIBUTES[kind])}")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= ATTRIBUTE_MAX:
            raise ApiError(400, f"{kind}.{key}={value!r}: expected an integer in [0, {ATTRIBUTE_MAX}]")
        attributes[key] = value
    if kind == "slicer":
        if attributes["average_size"] < 1:
            raise ApiError(400, "slicer.average_size must be >= 1")
        if attributes["size_variation"] >= attributes["average_size"]:
            raise ApiError(400, "slicer.size_variation must be < average_size")
    return Toxic(name, kind, stream, float(toxicity), attributes, uid)


