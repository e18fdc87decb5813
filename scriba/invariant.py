"""Assertions that stay on in production (plain ``assert`` vanishes under ``-O``)."""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A programmer error: a state the code promises can never happen."""


def invariant(condition: object, message: str) -> None:
    """Raise :class:`InvariantViolation` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise InvariantViolation(message)
