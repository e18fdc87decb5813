"""The placement-policy interface and the factory that builds a policy by name.

Every policy is pure: it takes a :class:`~scriba.placement.topology.Topology` and
sizes and returns a :class:`~scriba.placement.result.PlacementResult`; its only state
is its options and the ``random.Random`` passed in, so choices are reproducible.
``replace_bookie`` returns the whole new ensemble (the failed position replaced).
Names: ``random``, ``rack-aware``, ``zone-aware``, ``region-aware``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from scriba.errors import ConfigError
from scriba.ids import BookieId
from scriba.placement.base import BasePolicy
from scriba.placement.rack_aware import RackAwarePolicy
from scriba.placement.random_policy import RandomPolicy
from scriba.placement.region_aware import RegionAwarePolicy
from scriba.placement.result import Adherence, PlacementResult
from scriba.placement.topology import Topology
from scriba.placement.zone_aware import ZoneAwarePolicy


@runtime_checkable
class PlacementPolicy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def options(self) -> dict[str, Any]: ...

    @property
    def regions_for_durability(self) -> int: ...

    def new_ensemble(self, topology: Topology, ensemble_size: int, write_quorum_size: int,
                     ack_quorum_size: int, *, exclude: Collection[BookieId] = frozenset(),
                     local: str | None = None) -> PlacementResult: ...

    def replace_bookie(self, topology: Topology, ensemble: Sequence[BookieId], failed_index: int,
                       write_quorum_size: int, ack_quorum_size: int, *,
                       exclude: Collection[BookieId] = frozenset()) -> PlacementResult: ...

    def adherence(self, topology: Topology, ensemble: Sequence[BookieId], write_quorum_size: int,
                  ack_quorum_size: int) -> Adherence: ...

    def assess(self, topology: Topology, ensemble: Sequence[BookieId], write_quorum_size: int,
               ack_quorum_size: int) -> tuple[Adherence, list[str]]: ...

    def read_order(self, topology: Topology, write_set: Sequence[BookieId], *,
                   local: str | None = None, failed: Collection[BookieId] = ()) -> list[BookieId]: ...


POLICIES: Mapping[str, type[BasePolicy]] = {
    RandomPolicy.NAME: RandomPolicy,
    RackAwarePolicy.NAME: RackAwarePolicy,
    ZoneAwarePolicy.NAME: ZoneAwarePolicy,
    RegionAwarePolicy.NAME: RegionAwarePolicy,
}


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str = "random", options: Mapping[str, Any] | None = None, *,
                rng: random.Random | None = None) -> PlacementPolicy:
    """A policy by name; ConfigError for an unknown name or a bad option."""
    cls = POLICIES.get(name.replace("_", "-").lower() if isinstance(name, str) else "")
    if cls is None:
        raise ConfigError(f"placement policy {name!r}: unknown (known: {', '.join(POLICIES)})")
    return cls(options, rng=rng)
