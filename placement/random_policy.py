"""The ``random`` policy: any writable bookies, chosen at random weighted by free space.

No topology constraint; every write set of distinct writable bookies meets it
(MEETS_STRICT). Read-only, excluded and failed bookies are never chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scriba.placement.base import BasePolicy
from scriba.placement.spread import Keys, Rules


@dataclass(frozen=True, slots=True)
class RandomRules:
    levels: tuple[int, ...] = ()
    local_region: str | None = None

    def window_ok(self, keys: Sequence[Keys]) -> tuple[bool, bool]:
        return True, True


class RandomPolicy(BasePolicy):
    NAME = "random"

    def _rules(self, write_quorum_size: int, ack_quorum_size: int, local_region: str | None) -> Rules:
        return RandomRules()
