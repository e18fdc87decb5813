"""Logging: structlog with a fixed key vocabulary, quiet when embedded.

Keys: ``ledger_id``, ``entry_id``, ``bookie_id``, ``lac``, ``region``, ``zone``,
``rack``, ``elapsed_ms``. Events are snake_case facts (``ensemble_changed``).
Libraries call :func:`get_logger`; only the CLI calls :func:`configure`.

Two regimes, decided at each call, so a logger made at import time follows a later
``configure()``:
- structlog configured (by the ``scriba`` commands through :func:`configure`, which
  log at info level, or by the program embedding Scriba): that configuration decides
  levels, format and destination;
- nothing configured (a program that embeds the client and never set up structlog):
  warnings and above only, to stderr. A library must not fill its user's terminal
  with its debug lines, nor write to the user's stdout.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

EMBEDDED_LEVEL = logging.WARNING  # what a library prints when nobody configured logging

# structlog's level methods (and their async twins) below EMBEDDED_LEVEL
_QUIET_METHODS = frozenset({"debug", "info", "msg", "adebug", "ainfo", "amsg"})


def _drop(*args: Any, **kwargs: Any) -> None:
    return None


async def _adrop(*args: Any, **kwargs: Any) -> None:
    return None


class LibraryLogger:
    """A bound logger that follows structlog's configuration, or stays quiet without one."""

    __slots__ = ("_bound", "_name", "_proxy")

    def __init__(self, name: str, bound: dict[str, Any]) -> None:
        self._name = name
        self._bound = bound
        self._proxy: Any = structlog.get_logger(name, **bound)  # lazy: reads the config when used

    def bind(self, **new_values: Any) -> LibraryLogger:
        return LibraryLogger(self._name, {**self._bound, **new_values})

    def new(self, **new_values: Any) -> LibraryLogger:
        return LibraryLogger(self._name, dict(new_values))

    def unbind(self, *keys: str) -> LibraryLogger:
        missing = [k for k in keys if k not in self._bound]
        if missing:
            raise KeyError(missing[0])
        return self.try_unbind(*keys)

    def try_unbind(self, *keys: str) -> LibraryLogger:
        return LibraryLogger(self._name, {k: v for k, v in self._bound.items() if k not in keys})

    def __getattr__(self, method: str) -> Any:
        if structlog.is_configured():
            return getattr(self._proxy, method)
        if method in _QUIET_METHODS:
            return _adrop if method.startswith("a") else _drop
        return getattr(_embedded_logger().bind(**self._bound), method)


def _embedded_logger() -> Any:
    """structlog's default processors, warnings and above, to stderr as it is now."""
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(EMBEDDED_LEVEL),
    )


def get_logger(name: str, **bound: Any) -> Any:
    """The logger for module ``name`` (see the module docstring for what it prints)."""
    return LibraryLogger(name, bound)


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
