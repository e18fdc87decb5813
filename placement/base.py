"""The machinery every policy shares: option parsing, new ensembles, replacements, adherence.

A concrete policy says only what it asks of one write set (its :class:`Rules`), how
to phrase a miss, and which configurations are impossible. This class turns that
into ``new_ensemble`` / ``replace_bookie`` / ``adherence`` / ``read_order`` with
readable reasons and :class:`~scriba.errors.NotEnoughBookiesError` messages that
name the constraint and the counts.

States: none between calls (a policy holds only its options and rng). Inputs:
a Topology, quorum sizes, excluded (failed) bookies. Outputs: PlacementResult.
Invariant: a returned ensemble never holds an excluded, read-only or unknown bookie,
nor the same bookie twice; with enforcement on it meets the hard constraint on every
write set, or the call raises.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from scriba.errors import ConfigError, NotEnoughBookiesError
from scriba.ids import BookieId
from scriba.invariant import InvariantViolation, invariant
from scriba.placement import read_order as _read_order
from scriba.placement.result import Adherence, PlacementResult
from scriba.placement.spread import (
    LEVEL_NAMES,
    LOCAL,
    Keys,
    Pool,
    Rules,
    Score,
    adherence_of,
    affected_windows,
    ensemble_keys,
    greedy,
    improve,
    score,
    write_sets,
)
from scriba.placement.topology import Location, Topology

NEW_ENSEMBLE_ATTEMPTS_MAX = 3
_ADHERENCE = (Adherence.FAIL, Adherence.MEETS_SOFT, Adherence.MEETS_STRICT)


@dataclass(frozen=True, slots=True)
class Option:
    kind: type  # int or bool
    default: Any
    doc: str


def parse_options(policy: str, spec: Mapping[str, Option],
                  options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate and coerce options (strings from a CLI are accepted); ConfigError on bad input."""
    out = {k: o.default for k, o in spec.items()}
    for key, value in (options or {}).items():
        name = key.replace("-", "_")
        if name not in spec:
            known = ", ".join(sorted(spec)) or "none"
            raise ConfigError(f"{policy}: unknown option {key!r} (known: {known})")
        out[name] = _coerce(policy, name, spec[name].kind, value)
    return out


def _coerce(policy: str, name: str, kind: type, value: Any) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{policy}: option {name}: expected true or false, got {value!r}")
    if isinstance(value, bool):
        raise ConfigError(f"{policy}: option {name}: expected a whole number >= 1, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{policy}: option {name}: expected a whole number >= 1, got {value!r}") from None
    if number < 1 or (isinstance(value, float) and value != number):
        raise ConfigError(f"{policy}: option {name}: expected a whole number >= 1, got {value!r}")
    return number


def check_sizes(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
    if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
        raise ConfigError(
            f"need ensemble_size >= write_quorum_size >= ack_quorum_size >= 1, got "
            f"{ensemble_size}/{write_quorum_size}/{ack_quorum_size}"
        )


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class BasePolicy:
    """Shared implementation; subclasses set NAME, OPTIONS and the rules."""

    NAME: ClassVar[str] = ""
    OPTIONS: ClassVar[Mapping[str, Option]] = {
        "weighted": Option(bool, True, "choose among equals weighted by free space"),
    }

    def __init__(self, options: Mapping[str, Any] | None = None, *,
                 rng: random.Random | None = None) -> None:
        self._options = parse_options(self.NAME, self.OPTIONS, options)
        self._rng = rng if rng is not None else random.Random()
        self._validate()

    # --- what subclasses provide ----------------------------------------------
    def _validate(self) -> None:
        """Cross-option checks (ConfigError)."""

    def _check_config(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        """Refuse quorum sizes this policy can never satisfy (ConfigError)."""

    def _rules(self, write_quorum_size: int, ack_quorum_size: int, local_region: str | None) -> Rules:
        raise NotImplementedError

    @property
    def enforce(self) -> bool:
        """True: fail rather than return an ensemble that breaks the hard constraint."""
        return True

    def _constraint(self, write_quorum_size: int, ack_quorum_size: int) -> tuple[int, int, str]:
        """(level, domains each write set needs, the option that says so)."""
        return (LOCAL, 0, "")

    def _window_problems(self, keys: Sequence[Keys], write_quorum_size: int,
                         ack_quorum_size: int) -> tuple[str | None, str | None]:
        """(why the hard constraint fails, why the strict goal fails) for one write set."""
        return (None, None)

    def _replace_preference(self, failed: Keys, candidate: Keys) -> tuple[int, ...]:
        return ()

    def _preference_first(self) -> bool:
        """Rank the failed bookie's own domain before spreading (rack-aware does)."""
        return False

    # --- public API ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.NAME

    @property
    def options(self) -> dict[str, Any]:
        """Effective options (defaults filled), as recorded in ledger metadata."""
        return dict(self._options)

    @property
    def regions_for_durability(self) -> int:
        """Regions the writer's ack rule must see acks from (1: regions do not count)."""
        return 1

    def new_ensemble(self, topology: Topology, ensemble_size: int, write_quorum_size: int,
                     ack_quorum_size: int, *, exclude: Collection[BookieId] = frozenset(),
                     local: str | None = None) -> PlacementResult:
        check_sizes(ensemble_size, write_quorum_size, ack_quorum_size)
        self._check_config(ensemble_size, write_quorum_size, ack_quorum_size)
        local_region = Location.parse(local).region_path if local else None
        rules = self._rules(write_quorum_size, ack_quorum_size, local_region)
        unavailable = frozenset(exclude)
        probe = Pool(topology, unavailable, weighted=self._options["weighted"])
        eligible = probe.size()
        if eligible < ensemble_size:
            raise NotEnoughBookiesError(
                f"{self.NAME}: ensemble of {ensemble_size} needs {ensemble_size} bookies, only "
                f"{eligible} eligible ({self._counts(topology, unavailable)})"
            )
        level, needed, _ = self._constraint(write_quorum_size, ack_quorum_size)
        domains = probe.domains(level)
        feasible = level == LOCAL or len(domains) >= needed
        best: tuple[list[BookieId], Score] | None = None
        for _ in range(NEW_ENSEMBLE_ATTEMPTS_MAX if feasible else 1):
            pool = Pool(topology, unavailable, weighted=self._options["weighted"])
            chosen = greedy(topology, ensemble_size, write_quorum_size, rules, pool, self._rng)
            chosen, s = improve(topology, chosen, write_quorum_size, rules, pool, self._rng)
            if best is None or s < best[1]:
                best = (chosen, s)
            if s[0] == 0:
                break
        if best is None or len(best[0]) != ensemble_size:
            raise InvariantViolation(f"{self.NAME}: search returned a short ensemble")
        ensemble, s = best
        reasons = [f"{self.NAME}: chose {ensemble_size} of {eligible} eligible bookies "
                   f"({self._counts(topology, unavailable)})"]
        if s[0] > 0:
            why = self._shortfall(topology, unavailable, ensemble, write_quorum_size,
                                  ack_quorum_size, domains, s[0])
            if self.enforce:
                raise NotEnoughBookiesError(f"{self.NAME}: {why}")
            reasons.append(f"degraded (enforcement off): {why}")
        reasons.extend(self._describe(topology, ensemble, write_quorum_size, ack_quorum_size))
        if local_region is not None and any(lv == LOCAL for lv in rules.levels):
            n_local = sum(topology.location(b).region_path == local_region for b in ensemble)
            reasons.append(f"{n_local} of {ensemble_size} bookies in the local region {local_region}")
        reasons.append(self._tie_break_reason())
        return PlacementResult(tuple(ensemble), _ADHERENCE[adherence_of(s)], tuple(reasons))

    def replace_bookie(self, topology: Topology, ensemble: Sequence[BookieId], failed_index: int,
                       write_quorum_size: int, ack_quorum_size: int, *,
                       exclude: Collection[BookieId] = frozenset()) -> PlacementResult:
        e = len(ensemble)
        check_sizes(e, write_quorum_size, ack_quorum_size)
        invariant(0 <= failed_index < e, f"failed_index {failed_index} outside ensemble of {e}")
        self._check_config(e, write_quorum_size, ack_quorum_size)
        rules = self._rules(write_quorum_size, ack_quorum_size, None)
        failed = ensemble[failed_index]
        unavailable = frozenset(exclude) | frozenset(ensemble)
        pool = Pool(topology, unavailable, weighted=self._options["weighted"])
        open_racks = pool.open_racks()
        if not open_racks:
            raise NotEnoughBookiesError(
                f"{self.NAME}: no bookie can replace {failed} at index {failed_index}: every "
                f"writable bookie is in the ensemble or excluded "
                f"({self._counts(topology, frozenset(exclude))}, {e} in the ensemble)"
            )
        keys = ensemble_keys(topology, ensemble)
        failed_keys = keys[failed_index]
        windows = affected_windows(e, write_quorum_size, failed_index)
        best_key: tuple[int, ...] | None = None
        best_racks = []
        p0, p1, p2 = ({keys[i][lv] for w in windows for i in w if i != failed_index}
                      for lv in range(3))
        f0, f1, f2 = failed_keys
        local = rules.local_region
        memo: dict[tuple[object, ...], tuple[int, ...]] = {}
        for i, rack in open_racks:
            rk = rack.keys
            r0, r1, r2 = rk
            # racks that look alike to the scoring (same matches against the neighbours
            # and the failed bookie) score alike: compute each signature once
            sig = (r0 if r0 in p0 or r0 == f0 else None, r1 if r1 in p1 or r1 == f1 else None,
                   r2 if r2 in p2 or r2 == f2 else None, local is not None and r0 == local)
            key = memo.get(sig)
            if key is None:
                keys[failed_index] = rk
                s = score(rules, keys, windows)
                pref = self._replace_preference(failed_keys, rk)
                key = (*s[:2], *pref, *s[2:]) if self._preference_first() else (*s, *pref)
                memo[sig] = key
            if best_key is None or key < best_key:
                best_key, best_racks = key, [(i, rack)]
            elif key == best_key:
                best_racks.append((i, rack))
        if best_key is None:
            raise InvariantViolation(f"{self.NAME}: no candidate scored")
        chosen = pool.draw(best_racks, self._rng)
        new = list(ensemble)
        new[failed_index] = chosen
        loc = topology.location(chosen)
        reasons = [f"{self.NAME}: replaced {failed} ({topology.location(failed)}) at index "
                   f"{failed_index} with {chosen} ({loc}); {pool.size()} candidates "
                   f"({self._counts(topology, frozenset(exclude))})"]
        if best_key[0] > 0:
            level = self._constraint(write_quorum_size, ack_quorum_size)[0]
            domains = Pool(topology, frozenset(exclude)).domains(level)
            why = self._shortfall(topology, unavailable, new, write_quorum_size, ack_quorum_size,
                                  domains, best_key[0])
            if self.enforce:
                raise NotEnoughBookiesError(f"{self.NAME}: cannot replace {failed}: {why}")
            reasons.append(f"degraded (enforcement off): {why}")
        same = self._replace_preference(failed_keys, keys_of_loc(loc))
        if same and same[0] == 0:
            reasons.append("kept the failed bookie's own domain")
        reasons.extend(self._describe(topology, new, write_quorum_size, ack_quorum_size))
        reasons.append(self._tie_break_reason())
        full = score(rules, ensemble_keys(topology, new), write_sets(e, write_quorum_size))
        return PlacementResult(tuple(new), _ADHERENCE[adherence_of(full)], tuple(reasons))

    def adherence(self, topology: Topology, ensemble: Sequence[BookieId], write_quorum_size: int,
                  ack_quorum_size: int) -> Adherence:
        return self.assess(topology, ensemble, write_quorum_size, ack_quorum_size)[0]

    def assess(self, topology: Topology, ensemble: Sequence[BookieId], write_quorum_size: int,
               ack_quorum_size: int) -> tuple[Adherence, list[str]]:
        """Adherence plus one sentence per problem found (empty when MEETS_STRICT)."""
        e = len(ensemble)
        if not e >= write_quorum_size >= ack_quorum_size >= 1:
            return Adherence.FAIL, [f"quorums {e}/{write_quorum_size}/{ack_quorum_size} are invalid"]
        problems: list[str] = []
        hard = soft = False
        dups = sorted({b for b in ensemble if list(ensemble).count(b) > 1})
        if dups:
            hard = True
            problems.append(f"bookie {', '.join(dups)} appears more than once in the ensemble")
        unknown = [b for b in ensemble if b not in topology.nodes]
        if unknown:
            problems.append(f"not in the topology (read as the default location): {', '.join(unknown)}")
        keys = ensemble_keys(topology, ensemble)
        for w in write_sets(e, write_quorum_size):
            h, s = self._window_problems([keys[i] for i in w], write_quorum_size, ack_quorum_size)
            where = f"write set at {w[0]} ({', '.join(ensemble[i] for i in w)})"
            if h:
                hard = True
                problems.append(f"{where}: {h}")
            elif s:
                soft = True
                problems.append(f"{where}: {s}")
        if hard:
            return Adherence.FAIL, problems
        return (Adherence.MEETS_SOFT if soft else Adherence.MEETS_STRICT), problems

    def read_order(self, topology: Topology, write_set: Sequence[BookieId], *,
                   local: str | None = None, failed: Collection[BookieId] = ()) -> list[BookieId]:
        return _read_order.read_order(topology, write_set, local=local, failed=failed)

    # --- helpers --------------------------------------------------------------------
    def _tie_break_reason(self) -> str:
        how = "weighted by free space" if self._options["weighted"] else "uniformly"
        return f"among equally good candidates chose at random, {how}"

    @staticmethod
    def _counts(topology: Topology, excluded: Collection[BookieId]) -> str:
        total = len(topology)
        ro = total - len(topology.writable)
        ex = sum(1 for b in set(excluded) if b in topology.writable)
        return f"{ro} of {total} bookies read-only, {ex} excluded or failed"

    def _shortfall(self, topology: Topology, unavailable: Collection[BookieId],
                   ensemble: Sequence[BookieId], write_quorum_size: int, ack_quorum_size: int,
                   domains: Mapping[str, int], short: int) -> str:
        level, needed, option = self._constraint(write_quorum_size, ack_quorum_size)
        word = LEVEL_NAMES[level]
        counts = self._counts(topology, unavailable)
        if len(domains) < needed:
            names = ", ".join(sorted(domains)) or f"no {word}"
            verb = "has" if len(domains) == 1 else "have"
            return (f"write set needs {plural(needed, word)} ({option}), only {names} {verb} "
                    f"eligible writable bookies: {counts}")
        spread = ", ".join(f"{d}={n}" for d, n in sorted(domains.items()))
        n_sets = len(write_sets(len(ensemble), write_quorum_size))
        return (f"write set needs {plural(needed, word)} ({option}); with ensemble "
                f"{len(ensemble)} / write quorum {write_quorum_size} over eligible {word}s "
                f"{spread}, the best arrangement leaves {short} of {n_sets} write sets short "
                f"({counts})")

    def _describe(self, topology: Topology, ensemble: Sequence[BookieId], write_quorum_size: int,
                  ack_quorum_size: int) -> list[str]:
        level, needed, option = self._constraint(write_quorum_size, ack_quorum_size)
        if level == LOCAL:
            return []
        keys = ensemble_keys(topology, ensemble)
        spans = [len({keys[i][level] for i in w}) for w in write_sets(len(ensemble), write_quorum_size)]
        word = LEVEL_NAMES[level]
        return [f"each of {len(spans)} write sets spans {min(spans)}-{max(spans)} {word}s "
                f"(needs {needed}: {option})"]


def keys_of_loc(loc: Location) -> Keys:
    return (loc.region_path, loc.zone_path, loc.path)
