"""How far each replica of a group is behind, from their STATUS answers (I/O-free).

The most advanced replica (the leader applies on confirmation) is at the stream's
confirmed end; a replica's lag is the records it has applied fewer than that one, and
the difference of their replicated clocks (leader stamps) in seconds — 0 when nothing is
behind. Used by ``scriba shell rsm-status`` and the web console.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fill_lag(rows: Sequence[dict[str, Any]]) -> None:
    """Set ``lag_records`` and ``lag_s`` on every row that carries ``records_applied`` and ``clock_ms``."""
    answered = [r for r in rows if "records_applied" in r]
    if not answered:
        return
    most = max(answered, key=lambda r: (r["records_applied"], r["clock_ms"]))
    for row in answered:
        row["lag_records"] = most["records_applied"] - row["records_applied"]
        row["lag_s"] = round(max(0, most["clock_ms"] - row["clock_ms"]) / 1000, 3) if row["lag_records"] else 0.0
