"""Stream settings and names.

A namespace's settings are inherited by its streams; a stream may override any of
them. Both namespace and stream records store only the settings given explicitly
(overrides); the effective settings are ``StreamSettings()`` with the namespace's
overrides and then the stream's applied (:meth:`StreamSettings.with_overrides`).

Names: a namespace is 1-8 ``/``-separated segments of ``[A-Za-z0-9][A-Za-z0-9_-]*``
(each at most 64 characters), e.g. ``prod/payments``; a stream or cursor name is
``[A-Za-z0-9][A-Za-z0-9._-]*`` of at most 128 characters. A bad name is a
``ConfigError`` that names the rule it broke.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scriba.config import require
from scriba.entry import ENTRY_SIZE_MAX_DEFAULT
from scriba.errors import ConfigError
from scriba.stream.record_set import HEADER_BYTES

NAMESPACE_SEGMENTS_MAX: Final = 8
NAMESPACE_SEGMENT_CHARS_MAX: Final = 64
NAME_CHARS_MAX: Final = 128
_NAMESPACE_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

RECORD_SET_BYTES_LIMIT: Final = 4 * 1024 * 1024  # below the ledger entry limit, with room for the header
MiB: Final = 1024 * 1024


def check_namespace_name(name: object) -> str:
    rule = (
        f"a namespace is 1-{NAMESPACE_SEGMENTS_MAX} '/'-separated segments of "
        f"[A-Za-z0-9][A-Za-z0-9_-]* (each at most {NAMESPACE_SEGMENT_CHARS_MAX} characters)"
    )
    if not isinstance(name, str) or not name:
        raise ConfigError(f"namespace name {name!r}: {rule}")
    parts = name.split("/")
    if len(parts) > NAMESPACE_SEGMENTS_MAX:
        raise ConfigError(f"namespace name {name!r}: more than {NAMESPACE_SEGMENTS_MAX} segments; {rule}")
    for part in parts:
        if len(part) > NAMESPACE_SEGMENT_CHARS_MAX:
            raise ConfigError(f"namespace name {name!r}: segment {part[:20]!r}... too long; {rule}")
        if not _NAMESPACE_SEGMENT.fullmatch(part):
            raise ConfigError(f"namespace name {name!r}: bad segment {part!r}; {rule}")
    return name


def check_name(name: object, what: str = "stream") -> str:
    """A stream or cursor name."""
    rule = f"a {what} name is [A-Za-z0-9][A-Za-z0-9._-]* of at most {NAME_CHARS_MAX} characters"
    if not isinstance(name, str) or not name or len(name) > NAME_CHARS_MAX or not _NAME.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else name
        raise ConfigError(f"{what} name {shown!r}: {rule}")
    return name


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Everything a namespace or stream can set (``None`` for a limit: no limit)."""

    ensemble_size: int = 3
    write_quorum_size: int = 3
    ack_quorum_size: int = 2
    digest: str = "crc32c"
    placement: str | None = None  # None: the client's policy
    placement_options: Mapping[str, Any] = field(default_factory=dict)
    # rolling: a new segment once the current one passes any of these
    segment_bytes_max: int | None = 256 * MiB
    segment_records_max: int | None = None
    segment_age_s_max: float | None = None
    # packing
    record_set_bytes_max: int = 128 * 1024
    record_bytes_max: int = 1 * MiB
    # retention (whole closed segments; the last segment is always kept)
    retention_age_s_max: float | None = None
    retention_bytes_max: int | None = None
    retain_unconsumed: bool = False
    retention_interval_s: float | None = None  # a writer applies retention this often (None: never)

    def validate(self) -> StreamSettings:
        require(
            self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1,
            "quorums",
            "need ensemble_size >= write_quorum_size >= ack_quorum_size >= 1, got "
            f"{self.ensemble_size}/{self.write_quorum_size}/{self.ack_quorum_size}",
        )
        require(self.digest in ("crc32c", "hmac-sha256"), "digest", "crc32c or hmac-sha256")
        for name in ("segment_bytes_max", "segment_records_max", "retention_bytes_max"):
            value = getattr(self, name)
            require(value is None or (type(value) is int and value >= 1), name, "an int >= 1, or None")
        for name in ("segment_age_s_max", "retention_age_s_max", "retention_interval_s"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, int | float) and value > 0), name, "> 0, or None")
        require(
            type(self.record_set_bytes_max) is int and 1024 <= self.record_set_bytes_max <= RECORD_SET_BYTES_LIMIT,
            "record_set_bytes_max", f"an int in [1024, {RECORD_SET_BYTES_LIMIT}]",
        )
        require(
            type(self.record_bytes_max) is int
            and 1 <= self.record_bytes_max <= RECORD_SET_BYTES_LIMIT - HEADER_BYTES,
            "record_bytes_max", f"an int in [1, {RECORD_SET_BYTES_LIMIT - HEADER_BYTES}]",
        )
        require(RECORD_SET_BYTES_LIMIT < ENTRY_SIZE_MAX_DEFAULT, "record_set_bytes_max", "above the entry limit")
        require(isinstance(self.retain_unconsumed, bool), "retain_unconsumed", "must be a bool")
        require(isinstance(self.placement_options, Mapping), "placement_options", "must be a mapping")
        return self

    def with_overrides(self, overrides: Mapping[str, Any]) -> StreamSettings:
        """These settings with ``overrides`` applied; unknown names are a ``ConfigError``."""
        check_overrides(overrides)
        return dataclasses.replace(self, **dict(overrides)).validate()


SETTING_NAMES: Final = frozenset(f.name for f in dataclasses.fields(StreamSettings))


def check_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Known setting names only, and values JSON can hold; returns a plain dict."""
    unknown = sorted(set(overrides) - SETTING_NAMES)
    if unknown:
        raise ConfigError(f"unknown stream setting(s) {unknown}; known: {sorted(SETTING_NAMES)}")
    result = dict(overrides)
    if "placement_options" in result:
        result["placement_options"] = dict(result["placement_options"])
    return result


def effective_settings(namespace: Mapping[str, Any], stream: Mapping[str, Any]) -> StreamSettings:
    return StreamSettings().with_overrides({**namespace, **stream})
