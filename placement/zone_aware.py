"""The ``zone-aware`` policy (BookKeeper's ZoneawareEnsemblePlacementPolicy).

Every write set should span ``min(W, desired_zones_per_write_quorum)`` zones (default
3: MEETS_STRICT) and must span ``min(W, min_zones_per_write_quorum)`` (default 2:
MEETS_SOFT; fewer is FAIL). ``strict=True`` (the default) fails with
NotEnoughBookiesError rather than return a FAIL ensemble; ``strict=False`` degrades.
Two bookies of a write set share a zone only when no zone missing from it has a free
eligible bookie (the search aims for this and property tests check it for E = W and
E = 2W; when ensemble_size is not a multiple of write_quorum_size, which
BookKeeper's strict mode refuses, the wrapped write sets may hold fewer zones and
the reasons say so rather than failing). Inside a zone, racks are
spread too; with ``local`` given, zones of the writer's region are preferred.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from scriba.config import require
from scriba.ids import BookieId
from scriba.placement.base import BasePolicy, Option, plural
from scriba.placement.spread import LOCAL, RACK, ZONE, Keys, Rules
from scriba.placement.topology import Topology


@dataclass(frozen=True, slots=True)
class ZoneRules:
    zones_min: int
    zones_desired: int
    local_region: str | None = None

    @property
    def levels(self) -> tuple[int, ...]:
        return (ZONE, LOCAL, RACK) if self.local_region is not None else (ZONE, RACK)

    def window_ok(self, keys: Sequence[Keys]) -> tuple[bool, bool]:
        n = len({k[ZONE] for k in keys})
        return n >= self.zones_min, n >= self.zones_desired


class ZoneAwarePolicy(BasePolicy):
    NAME = "zone-aware"
    OPTIONS: ClassVar[Mapping[str, Option]] = {
        **BasePolicy.OPTIONS,
        "desired_zones_per_write_quorum": Option(int, 3, "zones a write set should span"),
        "min_zones_per_write_quorum": Option(int, 2, "zones a write set must span"),
        "strict": Option(bool, True, "fail rather than degrade below the minimum"),
    }

    def _validate(self) -> None:
        o = self._options
        require(o["desired_zones_per_write_quorum"] >= o["min_zones_per_write_quorum"],
                "zone-aware desired_zones_per_write_quorum",
                f"{o['desired_zones_per_write_quorum']} is below min_zones_per_write_quorum "
                f"{o['min_zones_per_write_quorum']}")

    @property
    def enforce(self) -> bool:
        return bool(self._options["strict"])

    def _sizes(self, write_quorum_size: int) -> tuple[int, int]:
        o = self._options
        return (min(write_quorum_size, o["min_zones_per_write_quorum"]),
                min(write_quorum_size, o["desired_zones_per_write_quorum"]))

    def _rules(self, write_quorum_size: int, ack_quorum_size: int, local_region: str | None) -> Rules:
        zmin, zdes = self._sizes(write_quorum_size)
        return ZoneRules(zmin, zdes, local_region)

    def _constraint(self, write_quorum_size: int, ack_quorum_size: int) -> tuple[int, int, str]:
        zmin, _ = self._sizes(write_quorum_size)
        return ZONE, zmin, f"min_zones_per_write_quorum={self._options['min_zones_per_write_quorum']}"

    def _window_problems(self, keys: Sequence[Keys], write_quorum_size: int,
                         ack_quorum_size: int) -> tuple[str | None, str | None]:
        zones = sorted({k[ZONE] for k in keys})
        zmin, zdes = self._sizes(write_quorum_size)
        text = f"spans {plural(len(zones), 'zone')} ({', '.join(zones)})"
        if len(zones) < zmin:
            return f"{text}; needs {zmin}", None
        if len(zones) < zdes:
            return None, f"{text}; desired {zdes}"
        return None, None

    def _replace_preference(self, failed: Keys, candidate: Keys) -> tuple[int, ...]:
        return (0 if candidate[ZONE] == failed[ZONE] else 1,
                0 if candidate[RACK] == failed[RACK] else 1)

    def _describe(self, topology: Topology, ensemble: Sequence[BookieId], write_quorum_size: int,
                  ack_quorum_size: int) -> list[str]:
        out = super()._describe(topology, ensemble, write_quorum_size, ack_quorum_size)
        if len(ensemble) % write_quorum_size:
            out.append(f"ensemble {len(ensemble)} is not a multiple of write quorum "
                       f"{write_quorum_size}: wrapped write sets may span fewer zones")
        return out
