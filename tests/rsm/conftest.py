"""RSM tests: the state machines and the simulation scenario live beside the tests; the
simulation kit and the in-process bookies come from ``scriba.testing.sim``."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)
