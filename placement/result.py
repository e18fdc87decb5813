"""What a placement decision returns: the bookies, how well they meet the policy, and why.

``Adherence`` ranks an ensemble against its policy: ``FAIL`` (a hard constraint is
broken for some write set), ``MEETS_SOFT`` (the hard constraints hold, the desired
spread does not), ``MEETS_STRICT`` (everything the policy asks for holds).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scriba.ids import BookieId


class Adherence(enum.Enum):
    FAIL = "FAIL"
    MEETS_SOFT = "MEETS_SOFT"
    MEETS_STRICT = "MEETS_STRICT"

    @property
    def rank(self) -> int:
        """0 for FAIL, 1 for MEETS_SOFT, 2 for MEETS_STRICT (higher is better)."""
        return _RANK[self]

    def at_least(self, other: Adherence) -> bool:
        return self.rank >= other.rank


_RANK = {Adherence.FAIL: 0, Adherence.MEETS_SOFT: 1, Adherence.MEETS_STRICT: 2}


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """An ensemble chosen by a policy.

    ``bookies`` is the whole ensemble in write order (for ``replace_bookie`` too: the
    new ensemble with the failed position replaced). ``reasons`` are short sentences
    a person can read: which constraint bound, what was excluded, what was degraded.
    """

    bookies: tuple[BookieId, ...]
    adherence: Adherence
    reasons: tuple[str, ...] = ()

    def replacement(self, index: int) -> BookieId:
        """The bookie now at ``index`` (the one chosen by ``replace_bookie(failed_index=index)``)."""
        return self.bookies[index]
