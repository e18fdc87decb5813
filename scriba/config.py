"""Configuration base: one frozen dataclass per component, with ``validate()``.

Only the CLI reads files and environment variables; components take a config
object. ``validate()`` fails fast with a :class:`~scriba.errors.ConfigError`
that names the field.
"""

from __future__ import annotations

from scriba.errors import ConfigError


def require(condition: bool, field: str, message: str) -> None:
    """Raise ``ConfigError("<field>: <message>")`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{field}: {message}")


def parse_host_port(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[v6]:PORT`` too) with a clear error."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"{text!r}: expected HOST:PORT")
        host, port_text = text, str(default_port)
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"{text!r}: missing host")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{text!r}: port {port} out of range")
    return host, port
