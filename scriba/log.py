"""Logging: structlog with a fixed key vocabulary.

Keys: ``ledger_id``, ``entry_id``, ``bookie_id``, ``lac``, ``region``, ``zone``,
``rack``, ``elapsed_ms``. Events are snake_case facts (``ensemble_changed``).
Libraries call :func:`get_logger`; only the CLI calls :func:`configure`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def get_logger(name: str, **bound: Any) -> Any:
    # Stay lazy: a logger bound at import time must still follow a later configure().
    return structlog.get_logger(name, **bound)


def configure(*, json: bool = False, level: str = "info", stream: Any = None) -> None:
    """Set up structlog for a process. Called by the CLI only."""
    out = stream if stream is not None else sys.stderr
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
