"""The ``rack-aware`` policy (BookKeeper's RackawareEnsemblePlacementPolicy).

Hard constraint: every write set spans at least ``min(W, min_racks_per_write_quorum)``
racks (default 2). ``enforce=True`` fails with NotEnoughBookiesError rather than
return an ensemble that breaks it; ``enforce=False`` (BookKeeper's default) degrades
and reports adherence FAIL with the reason. Racks are whole paths, so racks of the
same name in two zones are different racks. With ``local`` given, bookies of the
writer's region are preferred as long as the rack constraint holds. A replacement
prefers the failed bookie's rack, else another rack that keeps the constraint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from scriba.placement.base import BasePolicy, Option, plural
from scriba.placement.spread import LOCAL, RACK, Keys, Rules


@dataclass(frozen=True, slots=True)
class RackRules:
    racks_needed: int
    local_region: str | None = None

    @property
    def levels(self) -> tuple[int, ...]:
        return (LOCAL, RACK) if self.local_region is not None else (RACK,)

    def window_ok(self, keys: Sequence[Keys]) -> tuple[bool, bool]:
        ok = len({k[RACK] for k in keys}) >= self.racks_needed
        return ok, ok


class RackAwarePolicy(BasePolicy):
    NAME = "rack-aware"
    OPTIONS: ClassVar[Mapping[str, Option]] = {
        **BasePolicy.OPTIONS,
        "min_racks_per_write_quorum": Option(int, 2, "racks every write set must span"),
        "enforce": Option(bool, False, "fail rather than degrade when the racks are not there"),
    }

    @property
    def enforce(self) -> bool:
        return bool(self._options["enforce"])

    def _needed(self, write_quorum_size: int) -> int:
        return min(write_quorum_size, int(self._options["min_racks_per_write_quorum"]))

    def _rules(self, write_quorum_size: int, ack_quorum_size: int, local_region: str | None) -> Rules:
        return RackRules(self._needed(write_quorum_size), local_region)

    def _constraint(self, write_quorum_size: int, ack_quorum_size: int) -> tuple[int, int, str]:
        n = self._needed(write_quorum_size)
        return RACK, n, f"min_racks_per_write_quorum={self._options['min_racks_per_write_quorum']}"

    def _window_problems(self, keys: Sequence[Keys], write_quorum_size: int,
                         ack_quorum_size: int) -> tuple[str | None, str | None]:
        racks = sorted({k[RACK] for k in keys})
        n = self._needed(write_quorum_size)
        if len(racks) < n:
            return f"spans {plural(len(racks), 'rack')} ({', '.join(racks)}); needs {n}", None
        return None, None

    def _preference_first(self) -> bool:
        return True

    def _replace_preference(self, failed: Keys, candidate: Keys) -> tuple[int, ...]:
        return (0 if candidate[RACK] == failed[RACK] else 1,)
