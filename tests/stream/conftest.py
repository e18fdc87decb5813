"""Stream tests: in-process bookies come from the simulation kit (tests/sim until it moves
into ``scriba.testing.sim``)."""

from __future__ import annotations

import sys
from pathlib import Path

_SIM = str(Path(__file__).resolve().parents[1] / "sim")
if _SIM not in sys.path:
    sys.path.append(_SIM)
