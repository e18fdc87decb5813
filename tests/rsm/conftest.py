"""RSM tests: the seeded simulation kit's ``World`` and the in-process bookies come from
tests/sim (until the kit moves into ``scriba.testing.sim``)."""

from __future__ import annotations

import sys
from pathlib import Path

for _dir in ("sim", "rsm"):
    _path = str(Path(__file__).resolve().parents[1] / _dir)
    if _path not in sys.path:
        sys.path.append(_path)
