"""Placement: where a ledger's entries live (pure logic, no I/O).

``Topology`` (a networkx tree root -> regions -> zones -> racks -> bookies) plus the
policies ``random``, ``rack-aware``, ``zone-aware``, ``region-aware`` built by
:func:`make_policy`; :mod:`scriba.placement.explain` turns decisions into text/JSON.
"""

from scriba.placement.policy import PlacementPolicy, make_policy, policy_names
from scriba.placement.read_order import read_order
from scriba.placement.result import Adherence, PlacementResult
from scriba.placement.topology import (
    BookieNode,
    Location,
    Topology,
    load_topology_file,
    parse_topology_mapping,
    resolve_location,
)

__all__ = [
    "Adherence",
    "BookieNode",
    "Location",
    "PlacementPolicy",
    "PlacementResult",
    "Topology",
    "load_topology_file",
    "make_policy",
    "parse_topology_mapping",
    "policy_names",
    "read_order",
    "resolve_location",
]
