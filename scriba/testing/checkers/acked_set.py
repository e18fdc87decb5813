"""Acked-set checker: every acknowledged value is read back, nothing unknown appears.

Inputs: the values writers attempted, the values they were told were
acknowledged (and, optionally, those definitely rejected), and the values a
final read returned. Outputs an :class:`AckedSetResult`:

- ``lost = acknowledged - read`` must be empty (durability);
- ``unexpected = read - attempted`` must be empty (no invented data);
- ``rejected_but_read`` (a definite failure that nevertheless appeared) must be empty;
- indeterminate values that were read are ``recovered`` — allowed either way.

Values must be hashable (lists are frozen to tuples).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scriba.testing.history import History

SAMPLE_MAX = 20


def freeze(value: Any) -> Any:
    """A hashable equivalent of a JSON-ish value (lists -> tuples, dicts -> sorted item tuples)."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, set | frozenset):
        return frozenset(freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def sample(values: Iterable[Any], limit: int = SAMPLE_MAX) -> str:
    items = sorted(values, key=repr)
    shown = ", ".join(repr(v) for v in items[:limit])
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return f"[{shown}{more}]"


@dataclass(frozen=True, slots=True)
class AckedSetResult:
    attempted_count: int
    acknowledged_count: int
    read_count: int
    lost: frozenset[Any]
    unexpected: frozenset[Any]
    rejected_but_read: frozenset[Any]
    recovered: frozenset[Any]
    duplicated: frozenset[Any]

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unexpected and not self.rejected_but_read

    def explain(self) -> str:
        head = "acked set: OK" if self.ok else "acked set: VIOLATED"
        lines = [
            f"{head} — attempted {self.attempted_count}, acknowledged {self.acknowledged_count}, "
            f"read {self.read_count}",
            f"  lost (acknowledged, not read): {len(self.lost)} {sample(self.lost) if self.lost else ''}",
            f"  unexpected (read, never attempted): {len(self.unexpected)} "
            f"{sample(self.unexpected) if self.unexpected else ''}",
        ]
        if self.rejected_but_read:
            lines.append(f"  rejected but read: {len(self.rejected_but_read)} {sample(self.rejected_but_read)}")
        lines.append(f"  recovered (indeterminate, read): {len(self.recovered)}")
        if self.duplicated:
            lines.append(f"  read more than once: {len(self.duplicated)} {sample(self.duplicated)}")
        return "\n".join(line.rstrip() for line in lines)


def check_acked_set(
    attempted: Iterable[Any],
    acknowledged: Iterable[Any],
    read: Iterable[Any],
    *,
    rejected: Iterable[Any] = (),
) -> AckedSetResult:
    attempted_set = frozenset(freeze(v) for v in attempted)
    acked_set = frozenset(freeze(v) for v in acknowledged)
    read_counts = Counter(freeze(v) for v in read)
    read_set = frozenset(read_counts)
    rejected_set = frozenset(freeze(v) for v in rejected)
    return AckedSetResult(
        attempted_count=len(attempted_set),
        acknowledged_count=len(acked_set),
        read_count=len(read_set),
        lost=acked_set - read_set,
        unexpected=read_set - attempted_set - acked_set,
        rejected_but_read=(rejected_set - acked_set) & read_set,
        recovered=(read_set & attempted_set) - acked_set - rejected_set,
        duplicated=frozenset(v for v, n in read_counts.items() if n > 1),
    )


def check_acked_set_history(history: History, read: Iterable[Any], *, f: str = "add") -> AckedSetResult:
    """Acked set from a history: invoke values of ``f`` are attempted, ``ok`` ones acknowledged,
    ``fail`` ones rejected; ``info`` and never-completed ones are indeterminate."""
    attempted, acknowledged, rejected = [], [], []
    for pair in history.pairs():
        if pair.invoke.f != f:
            continue
        attempted.append(pair.invoke.value)
        if pair.status == "ok":
            acknowledged.append(pair.invoke.value)
        elif pair.status == "fail":
            rejected.append(pair.invoke.value)
    return check_acked_set(attempted, acknowledged, read, rejected=rejected)
