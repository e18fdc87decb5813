"""The ``region-aware`` policy (BookKeeper's RegionAwareEnsemblePlacementPolicy).

Hard constraint: every write set reaches ``min_regions_for_durability`` regions
(default 2) and its ack quorum cannot be met inside fewer regions: the bookies of
the ``R - 1`` best-filled regions of the write set number fewer than
``ack_quorum_size``, so every acknowledged entry is in ``R`` regions. Such a
placement exists only when ``ack_quorum_size > W - W // R`` (BookKeeper's rule);
other quorums are refused with ConfigError. Inside each region zones, then racks,
are spread (MEETS_STRICT when no two bookies of a write set share a rack).
``enforce_durability=False`` degrades instead of failing when regions are missing.
When enforced, ledgers record ``min_regions_for_durability`` and the writer's ack
rule counts regions as well (``regions_for_durability``; ``scriba.quorum``).
``ack_rule_only=True`` leaves the ack quorum's spread to that ack rule: placement then
only makes every write set reach ``R`` regions, which admits cheaper quorums (W3/A2 over
two regions: an entry waits for the other region's ack instead of for a third copy);
it needs ``ack_quorum_size >= R`` and ``enforce_durability``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from scriba.errors import ConfigError
from scriba.placement.base import BasePolicy, Option, plural
from scriba.placement.spread import LOCAL, RACK, REGION, ZONE, Keys, Rules


def _region_counts(keys: Sequence[Keys]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for k in keys:
        counts[k[REGION]] = counts.get(k[REGION], 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass(frozen=True, slots=True)
class RegionRules:
    regions_min: int
    ack_quorum_size: int
    local_region: str | None = None
    ack_rule_only: bool = False

    @property
    def levels(self) -> tuple[int, ...]:
        return (REGION, ZONE, RACK, LOCAL) if self.local_region is not None else (REGION, ZONE, RACK)

    def window_ok(self, keys: Sequence[Keys]) -> tuple[bool, bool]:
        counts = _region_counts(keys)
        top = sum(n for _, n in counts[: self.regions_min - 1])
        hard = len(counts) >= self.regions_min and (self.ack_rule_only or top < self.ack_quorum_size)
        return hard, hard and len({k[RACK] for k in keys}) == len(keys)


class RegionAwarePolicy(BasePolicy):
    NAME = "region-aware"
    OPTIONS: ClassVar[Mapping[str, Option]] = {
        **BasePolicy.OPTIONS,
        "min_regions_for_durability": Option(int, 2, "regions every acknowledged entry reaches"),
        "enforce_durability": Option(bool, True, "fail rather than degrade when regions are missing"),
        "ack_rule_only": Option(bool, False, "write sets reach the regions; the ack rule alone spreads each ack "
                                             "quorum over them (cheaper quorums)"),
    }

    @property
    def _ack_rule_only(self) -> bool:
        return bool(self._options["ack_rule_only"])

    @property
    def enforce(self) -> bool:
        return bool(self._options["enforce_durability"])

    @property
    def _regions(self) -> int:
        return int(self._options["min_regions_for_durability"])

    @property
    def regions_for_durability(self) -> int:
        """``min_regions_for_durability`` when enforced: the ack rule counts regions too
        (BookKeeper's ``enforceDurability``); degrading placement leaves them uncounted."""
        return self._regions if self.enforce else 1

    def _check_config(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        r, w, a = self._regions, write_quorum_size, ack_quorum_size
        if self._ack_rule_only:
            if not self.enforce:
                raise ConfigError("region-aware: ack_rule_only needs enforce_durability (the ack rule is what "
                                  "keeps the regions)")
            if a < r:
                raise ConfigError(f"region-aware: ack_rule_only: ack_quorum_size {a} < min_regions_for_durability "
                                  f"{r}: an ack quorum could never span {r} regions")
            return
        if self.enforce and a <= w - w // r:
            raise ConfigError(
                f"region-aware: impossible configuration: ack_quorum_size {a} <= write_quorum_size "
                f"{w} - write_quorum_size / min_regions_for_durability ({w} - {w // r} = "
                f"{w - w // r}), so an ack quorum could always be met inside fewer than {r} "
                f"regions; use ack_quorum_size > {w - w // r}, a larger write quorum, or lower "
                f"min_regions_for_durability"
            )

    def _rules(self, write_quorum_size: int, ack_quorum_size: int, local_region: str | None) -> Rules:
        return RegionRules(self._regions, ack_quorum_size, local_region, self._ack_rule_only)

    def _constraint(self, write_quorum_size: int, ack_quorum_size: int) -> tuple[int, int, str]:
        return REGION, self._regions, f"min_regions_for_durability={self._regions}"

    def _window_problems(self, keys: Sequence[Keys], write_quorum_size: int,
                         ack_quorum_size: int) -> tuple[str | None, str | None]:
        counts = _region_counts(keys)
        r = self._regions
        spread = ", ".join(f"{reg}={n}" for reg, n in counts)
        if len(counts) < r:
            return f"reaches {plural(len(counts), 'region')} ({spread}); needs {r}", None
        top = sum(n for _, n in counts[: r - 1])
        if top >= ack_quorum_size and not self._ack_rule_only:
            inside = ", ".join(reg for reg, _ in counts[: r - 1])
            return (f"an ack quorum of {ack_quorum_size} fits inside {inside} ({top} bookies; "
                    f"regions {spread}); needs {r} regions per ack quorum"), None
        racks = [k[RACK] for k in keys]
        if len(set(racks)) < len(racks):
            dup = sorted({x for x in racks if racks.count(x) > 1})
            return None, f"two bookies share rack {', '.join(dup)}"
        return None, None

    def _replace_preference(self, failed: Keys, candidate: Keys) -> tuple[int, ...]:
        return tuple(0 if candidate[lv] == failed[lv] else 1 for lv in (REGION, ZONE, RACK))

