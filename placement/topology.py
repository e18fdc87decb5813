"""The cluster's shape as placement sees it: a tree root -> regions -> zones -> racks -> bookies.

Inputs: :class:`BookieNode` records (built by the client from the bookie registry,
or by tests). Output: an immutable :class:`Topology` holding a networkx tree (built
on first use) plus indexes computed once per object (writable bookies per rack with their selection
weights, racks per zone, zones per region), so a policy call never rescans the graph.

Invariants: every bookie has exactly one location ``/region/zone/rack``; a
topology never changes after construction (``with_node`` / ``without`` derive a new
one, as the registry watch delivers joins, leaves and read-only turns).

Locations of bookies whose registration carries none come from a topology file
(YAML or JSON mapping bookie id or address -> ``/region/zone/rack``, the format
terraform writes); a bookie found nowhere gets ``/default-region/default-zone/default-rack``,
logged once per bookie.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from scriba.errors import ConfigError
from scriba.ids import BookieId
from scriba.log import get_logger

DEFAULT_REGION = "default-region"
DEFAULT_ZONE = "default-zone"
DEFAULT_RACK = "default-rack"

WEIGHT_MULTIPLE_MAX = 3.0
"""A bookie with much free space is chosen at most this many times as often as an average one."""

_LOGGED_DEFAULTS_MAX = 10_000
_logged_defaults: set[str] = set()
_log = get_logger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class Location:
    """Where a bookie lives: region, zone and rack names (not paths)."""

    region: str = DEFAULT_REGION
    zone: str = DEFAULT_ZONE
    rack: str = DEFAULT_RACK

    @property
    def path(self) -> str:
        """``/region/zone/rack``."""
        return f"/{self.region}/{self.zone}/{self.rack}"

    @property
    def zone_path(self) -> str:
        return f"/{self.region}/{self.zone}"

    @property
    def region_path(self) -> str:
        return f"/{self.region}"

    @classmethod
    def parse(cls, text: str) -> Location:
        """Parse ``/region/zone/rack``; ``/zone/rack`` and ``/rack`` fill defaults from the top.

        BookKeeper's rack-aware scripts print ``/rack`` or ``/region/rack``-style paths;
        we accept one to three parts and name the missing upper levels by default.
        """
        if not isinstance(text, str) or not text.startswith("/"):
            raise ConfigError(f"location {text!r}: expected /region/zone/rack")
        parts = text.strip("/").split("/")
        if not 1 <= len(parts) <= 3 or any(not p.strip() for p in parts):
            raise ConfigError(f"location {text!r}: expected /region/zone/rack")
        parts = [p.strip() for p in parts]
        if len(parts) == 3:
            return cls(parts[0], parts[1], parts[2])
        if len(parts) == 2:
            return cls(DEFAULT_REGION, parts[0], parts[1])
        return cls(DEFAULT_REGION, DEFAULT_ZONE, parts[0])

    def __str__(self) -> str:
        return self.path


DEFAULT_LOCATION = Location()


@dataclass(frozen=True, slots=True)
class BookieNode:
    """One bookie as placement sees it."""

    bookie_id: BookieId
    region: str = DEFAULT_REGION
    zone: str = DEFAULT_ZONE
    rack: str = DEFAULT_RACK
    writable: bool = True
    free_bytes: int = 0

    @property
    def location(self) -> Location:
        return Location(self.region, self.zone, self.rack)

    @classmethod
    def at(cls, bookie_id: str, location: str | Location, *, writable: bool = True,
           free_bytes: int = 0) -> BookieNode:
        loc = location if isinstance(location, Location) else Location.parse(location)
        return cls(BookieId(bookie_id), loc.region, loc.zone, loc.rack, writable, free_bytes)

    @classmethod
    def from_registration(cls, reg: Any,
                          locations: Mapping[str, Location] | None = None) -> BookieNode:
        """From a ``scriba.meta.records.BookieRegistration`` (duck-typed: no meta import).

        A location in ``locations`` (from a topology file, keyed by bookie id or address)
        wins over the registration's own; a registration still at the defaults with no
        file entry is logged once.
        """
        loc: Location | None = None
        if locations:
            loc = locations.get(str(reg.bookie_id)) or locations.get(str(getattr(reg, "address", "")))
        if loc is None:
            loc = Location(reg.region or DEFAULT_REGION, reg.zone or DEFAULT_ZONE,
                           reg.rack or DEFAULT_RACK)
            if loc == DEFAULT_LOCATION:
                _log_default_once(str(reg.bookie_id))
        return cls(BookieId(str(reg.bookie_id)), loc.region, loc.zone, loc.rack,
                   bool(reg.writable), int(getattr(reg, "free_bytes", 0) or 0))


def _log_default_once(bookie_id: str) -> None:
    if bookie_id in _logged_defaults or len(_logged_defaults) >= _LOGGED_DEFAULTS_MAX:
        return
    _logged_defaults.add(bookie_id)
    _log.info("bookie_location_unknown", bookie_id=bookie_id, location=DEFAULT_LOCATION.path)


def resolve_location(locations: Mapping[str, Location], bookie_id: str,
                     address: str | None = None) -> Location:
    """The location of a bookie from a topology-file mapping; unknown -> default (logged once)."""
    loc = locations.get(bookie_id)
    if loc is None and address:
        loc = locations.get(address)
    if loc is None:
        _log_default_once(bookie_id)
        return DEFAULT_LOCATION
    return loc


def parse_topology_mapping(text: str, *, fmt: str | None = None) -> dict[str, Location]:
    """Parse a topology file's text: a mapping bookie id or address -> location.

    Accepted shapes (YAML or JSON): ``{"bk1": "/r/z/k", ...}``, the same under a
    top-level ``bookies:`` key, and values given as ``{region:, zone:, rack:}``.
    """
    doc: Any
    if fmt == "json" or (fmt is None and text.lstrip().startswith("{")):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"topology file: not valid JSON: {exc}") from None
    else:
        import yaml  # only the helper that reads files needs it

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"topology file: not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if isinstance(doc, dict) and isinstance(doc.get("bookies"), dict):
        doc = doc["bookies"]
    if not isinstance(doc, dict):
        raise ConfigError("topology file: expected a mapping of bookie id or address to location")
    out: dict[str, Location] = {}
    for key, value in doc.items():
        if isinstance(value, str):
            out[str(key)] = Location.parse(value)
        elif isinstance(value, dict):
            out[str(key)] = Location(str(value.get("region", DEFAULT_REGION)),
                                     str(value.get("zone", DEFAULT_ZONE)),
                                     str(value.get("rack", DEFAULT_RACK)))
        else:
            raise ConfigError(f"topology file: {key}: expected a location string or mapping")
    return out


def load_topology_file(path: str | Path) -> dict[str, Location]:
    """Read and parse a topology file (``.json`` as JSON, anything else as YAML)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"topology file {p}: {exc.strerror or exc}") from None
    return parse_topology_mapping(text, fmt="json" if p.suffix == ".json" else None)


@dataclass(frozen=True, slots=True)
class RackIndex:
    """The writable bookies of one rack, with weights for weighted random choice."""

    location: Location
    keys: tuple[str, str, str]  # (region path, zone path, rack path): domain per level
    bookies: tuple[BookieId, ...]
    weights: tuple[float, ...]
    total_weight: float


def _weights(nodes: Iterable[BookieNode]) -> dict[BookieId, float]:
    """Selection weight per writable bookie: its free space, capped; unknown -> average."""
    writable = [n for n in nodes if n.writable]
    known = [n.free_bytes for n in writable if n.free_bytes > 0]
    if not known:
        return {n.bookie_id: 1.0 for n in writable}
    mean = sum(known) / len(known)
    cap = WEIGHT_MULTIPLE_MAX * mean
    floor = mean / (WEIGHT_MULTIPLE_MAX * 100)
    return {
        n.bookie_id: max(min(float(n.free_bytes) if n.free_bytes > 0 else mean, cap), floor) / mean
        for n in writable
    }


class Topology:
    """An immutable view of the cluster: a networkx tree plus per-topology indexes."""

    __slots__ = ("_graph", "_nodes", "_rack_of", "_racks", "_racks_under", "_weights", "_writable")

    ROOT = "/"

    def __init__(self, nodes: Mapping[BookieId, BookieNode]) -> None:
        self._nodes: Mapping[BookieId, BookieNode] = types.MappingProxyType(dict(nodes))
        self._weights = _weights(self._nodes.values())
        self._writable = frozenset(b for b, n in self._nodes.items() if n.writable)
        self._graph: nx.DiGraph | None = None  # built on first use: policies need only the indexes
        by_rack: dict[Location, list[BookieId]] = {}
        for bid in sorted(self._nodes):
            node = self._nodes[bid]
            if node.writable:
                by_rack.setdefault(node.location, []).append(bid)
        racks = []
        for loc in sorted(by_rack):
            ids = tuple(by_rack[loc])
            weights = tuple(self._weights[b] for b in ids)
            racks.append(RackIndex(loc, (loc.region_path, loc.zone_path, loc.path), ids, weights,
                                   sum(weights)))
        self._racks: tuple[RackIndex, ...] = tuple(racks)
        self._rack_of: Mapping[BookieId, int] = {
            b: i for i, rack in enumerate(self._racks) for b in rack.bookies
        }
        under: dict[str, list[int]] = {}
        for i, rack in enumerate(self._racks):
            for key in rack.keys:
                under.setdefault(key, []).append(i)
        self._racks_under: Mapping[str, tuple[int, ...]] = {k: tuple(v) for k, v in under.items()}

    # --- construction ----------------------------------------------------------
    @classmethod
    def from_nodes(cls, nodes: Iterable[BookieNode]) -> Topology:
        by_id: dict[BookieId, BookieNode] = {}
        for node in nodes:
            if node.bookie_id in by_id:
                raise ConfigError(f"topology: bookie {node.bookie_id} listed twice")
            by_id[node.bookie_id] = node
        return cls(by_id)

    @classmethod
    def from_registrations(cls, registrations: Iterable[Any],
                           locations: Mapping[str, Location] | None = None) -> Topology:
        """From ``BookieRegistration`` records (duck-typed), with optional file locations."""
        return cls.from_nodes(BookieNode.from_registration(r, locations) for r in registrations)

    def with_node(self, node: BookieNode) -> Topology:
        """A topology where ``node`` is added or replaces the bookie of the same id."""
        nodes = dict(self._nodes)
        nodes[node.bookie_id] = node
        return Topology(nodes)

    def without(self, bookie_id: BookieId) -> Topology:
        nodes = dict(self._nodes)
        nodes.pop(bookie_id, None)
        return Topology(nodes)

    # --- queries ---------------------------------------------------------------
    @property
    def nodes(self) -> Mapping[BookieId, BookieNode]:
        return self._nodes

    @property
    def graph(self) -> nx.DiGraph:
        """The tree root -> /region -> /region/zone -> /region/zone/rack -> ("bookie", id).

        Nodes carry ``kind`` (root, region, zone, rack, bookie); bookie nodes carry ``node``.
        """
        if self._graph is None:
            self._graph = self._build_graph()
        return self._graph

    def _build_graph(self) -> nx.DiGraph:
        graph: nx.DiGraph = nx.DiGraph()
        graph.add_node(self.ROOT, kind="root")
        for bid in sorted(self._nodes):
            node = self._nodes[bid]
            loc = node.location
            graph.add_edge(self.ROOT, loc.region_path)
            graph.nodes[loc.region_path]["kind"] = "region"
            graph.add_edge(loc.region_path, loc.zone_path)
            graph.nodes[loc.zone_path]["kind"] = "zone"
            graph.add_edge(loc.zone_path, loc.path)
            graph.nodes[loc.path]["kind"] = "rack"
            graph.add_edge(loc.path, ("bookie", bid))
            graph.nodes[("bookie", bid)].update(kind="bookie", node=node)
        return graph

    @property
    def racks(self) -> tuple[RackIndex, ...]:
        """Racks that hold at least one writable bookie (sorted by location)."""
        return self._racks

    def racks_under(self, domain_path: str) -> tuple[int, ...]:
        """Indexes into :attr:`racks` of the writable racks below a region/zone/rack path."""
        return self._racks_under.get(domain_path, ())

    def rack_index_of(self, bookie_id: BookieId) -> int | None:
        """Index into :attr:`racks` of a writable bookie (None if read-only or unknown)."""
        return self._rack_of.get(bookie_id)

    @property
    def writable(self) -> frozenset[BookieId]:
        return self._writable

    def weight(self, bookie_id: BookieId) -> float:
        return self._weights.get(bookie_id, 0.0)

    def location(self, bookie_id: BookieId) -> Location:
        """A bookie's location; a bookie not in the topology reads as the default location."""
        node = self._nodes.get(bookie_id)
        return node.location if node is not None else DEFAULT_LOCATION

    def is_writable(self, bookie_id: BookieId) -> bool:
        return bookie_id in self._writable

    def children(self, path: str) -> list[str]:
        """Domain paths below ``path`` ("/" -> regions, "/r" -> zones, "/r/z" -> racks)."""
        graph = self.graph
        if path not in graph:
            return []
        return sorted(c for c in graph.successors(path) if isinstance(c, str))

    def bookies_under(self, path: str) -> list[BookieId]:
        """All bookies (writable or not) below a domain path."""
        graph = self.graph
        if path not in graph:
            return []
        return sorted(n[1] for n in nx.descendants(graph, path) if isinstance(n, tuple))

    def summary(self) -> dict[str, Any]:
        """Counts per region/zone/rack: ``{path: {"writable": n, "read_only": m}}`` plus totals."""
        per: dict[str, dict[str, int]] = {}
        for node in self._nodes.values():
            loc = node.location
            for path in (loc.region_path, loc.zone_path, loc.path):
                c = per.setdefault(path, {"writable": 0, "read_only": 0})
                c["writable" if node.writable else "read_only"] += 1
        return {
            "bookies": len(self._nodes),
            "writable": len(self._writable),
            "read_only": len(self._nodes) - len(self._writable),
            "domains": dict(sorted(per.items())),
        }

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"Topology({len(self._nodes)} bookies, {len(self._writable)} writable, {len(self._racks)} racks)"
