"""Secrets named by a metadata URI (``password_file=``, ``password_env=``, ``digest_*``).

A secret is read when a store opens, kept only in the store's memory, and never put in
an error message, a log line or a ``repr``: errors name the file or the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

from scriba.errors import ConfigError
from scriba.meta.uri import MetadataUri

SECRET_BYTES_MAX = 4096


def secret(parsed: MetadataUri, file_option: str, env_option: str) -> str | None:
    """The secret the URI names (file first line, or environment variable), or None."""
    path = parsed.option(file_option)
    if path is not None:
        try:
            text = Path(path).read_text()[:SECRET_BYTES_MAX]
        except OSError as exc:
            raise ConfigError(f"{file_option} {path}: cannot read ({exc.strerror})") from None
        value = text.splitlines()[0] if text else ""
        if not value:
            raise ConfigError(f"{file_option} {path}: empty")
        return value
    name = parsed.option(env_option)
    if name is not None:
        value = os.environ.get(name, "")
        if not value:
            raise ConfigError(f"{env_option} {name}: environment variable not set or empty")
        return value
    return None
