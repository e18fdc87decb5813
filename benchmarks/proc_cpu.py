"""CPU time of this benchmark's processes, from ``/proc`` (shared by the benchmarks that
report CPU per operation beside their rates: steadier than rates on a busy machine)."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS_S = os.sysconf("SC_CLK_TCK")


def descendants_cpu_s(root: int | None = None) -> float:
    """User + system CPU seconds of every living descendant of ``root`` (this process)."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS_S)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total


def pids_cpu_s(pids: list[int], *, system_only: bool = False) -> float:
    """User + system CPU seconds of the living processes ``pids`` (ended ones count 0);
    ``system_only``: the kernel's part alone."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[12]) + (0 if system_only else int(fields[11]))) / _TICKS_S
    return total
