"""RSM convergence checker: replicas apply the same commands in the same order, once.

Inputs: one :class:`ReplicaTrace` per replica — the (position, command id,
state digest after applying) records it applied, in apply order, plus digests it
reported at positions without an apply (after restoring a snapshot, say).

Checks:
1. each replica's positions strictly increase;
2. each replica applies a command id at most once;
3. replicas that applied the same position applied the same command id there;
4. replicas report equal state digests at equal positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VIOLATIONS_SHOWN_MAX = 30


@dataclass(frozen=True, slots=True)
class Applied:
    position: int
    command_id: Any
    state_digest: Any = None  # the replica's state digest right after this apply, if known


@dataclass(frozen=True, slots=True)
class ReplicaTrace:
    replica: str
    applied: tuple[Applied, ...]
    digests: tuple[tuple[int, Any], ...] = ()  # (position, digest) reported without an apply

    @staticmethod
    def build(replica: str, applied: Iterable[Applied], digests: Mapping[int, Any] | None = None) -> ReplicaTrace:
        return ReplicaTrace(replica, tuple(applied), tuple(sorted((digests or {}).items())))


@dataclass(frozen=True, slots=True)
class RsmResult:
    replicas: int
    positions: int
    compared_digests: int
    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def explain(self) -> str:
        lines = [
            f"rsm convergence: {'OK' if self.ok else 'VIOLATED'} — {self.replicas} replicas, "
            f"{self.positions} positions, {self.compared_digests} digest comparisons"
        ]
        lines += [f"  - {v}" for v in self.violations[:VIOLATIONS_SHOWN_MAX]]
        if len(self.violations) > VIOLATIONS_SHOWN_MAX:
            lines.append(f"  ... {len(self.violations) - VIOLATIONS_SHOWN_MAX} more")
        return "\n".join(lines)


def check_rsm(traces: Iterable[ReplicaTrace]) -> RsmResult:
    traces = list(traces)
    violations: list[str] = []
    commands: dict[int, tuple[Any, str]] = {}  # position -> (command id, first replica)
    digests: dict[int, tuple[Any, str]] = {}  # position -> (digest, first replica)
    compared = 0
    for trace in traces:
        _order_and_once(trace, violations)
        for rec in trace.applied:
            first = commands.setdefault(rec.position, (rec.command_id, trace.replica))
            if first[0] != rec.command_id:
                violations.append(
                    f"position {rec.position}: {trace.replica} applied {rec.command_id!r} "
                    f"but {first[1]} applied {first[0]!r}"
                )
        reported = [(r.position, r.state_digest) for r in trace.applied if r.state_digest is not None]
        for position, digest in reported + list(trace.digests):
            first = digests.setdefault(position, (digest, trace.replica))
            if first[1] != trace.replica:
                compared += 1
            if first[0] != digest:
                violations.append(
                    f"position {position}: {trace.replica} has state digest {digest!r} "
                    f"but {first[1]} has {first[0]!r}"
                )
    return RsmResult(len(traces), len(commands), compared, tuple(violations))


def _order_and_once(trace: ReplicaTrace, violations: list[str]) -> None:
    last = None
    seen: dict[Any, int] = {}
    for rec in trace.applied:
        if last is not None and rec.position <= last:
            violations.append(f"{trace.replica}: applied position {rec.position} after {last} (not increasing)")
        last = rec.position
        if rec.command_id in seen:
            violations.append(
                f"{trace.replica}: command {rec.command_id!r} applied twice "
                f"(positions {seen[rec.command_id]} and {rec.position})"
            )
        seen.setdefault(rec.command_id, rec.position)
