"""Which asyncio event loop a Scriba process runs on (``scriba bookie run``, ``scriba bench``).

``run(main)`` is ``asyncio.run(main)`` on the loop ``SCRIBA_EVENT_LOOP`` names:
``asyncio`` (the standard loop, the default) or ``uvloop`` (when installed; else the
standard loop, with a warning). uvloop is not a dependency: on this 2-core machine it
showed no gain beyond the noise for the binary data path (``benchmarks/bench_client.py``
under ``SCRIBA_EVENT_LOOP=uvloop``, 2026-11-25), so it stays an opt-in to re-measure.
Only command entry points call it: a library never picks its caller's loop.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from scriba.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")
LOOPS = ("asyncio", "uvloop")


def loop_name() -> str:
    """The loop ``SCRIBA_EVENT_LOOP`` asks for (``asyncio`` when unset or unknown)."""
    name = os.environ.get("SCRIBA_EVENT_LOOP", "asyncio").strip().lower()
    return name if name in LOOPS else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    if loop_name() == "uvloop":
        try:
            uvloop: Any = importlib.import_module("uvloop")  # optional: not a dependency
        except ImportError:
            log.warning("uvloop_missing", fallback="asyncio")
        else:
            return uvloop.run(main)  # type: ignore[no-any-return]
    return asyncio.run(main)
