"""WebHDFS query parameters: names case-insensitive, values checked with the errors Hadoop
gives (``IllegalArgumentException``: ``Invalid value for webhdfs parameter ...``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from scriba.examples.namenode.errors import IllegalArgumentException


class Params:
    BLOCK_SIZE: Final = 128 * 1024 * 1024
    DEFAULT_USER: Final = "dr.who"

    def __init__(self, query: Mapping[str, str]) -> None:
        self._values = {k.lower(): v for k, v in query.items()}
        self.op = self._values.get("op", "").upper()
        self.user = self._values.get("user.name") or self._values.get("doas") or self.DEFAULT_USER
        self.group = "supergroup"

    def text(self, name: str, default: str) -> str:
        return self._values.get(name, default)

    def _bad(self, name: str, value: str, why: str) -> IllegalArgumentException:
        return IllegalArgumentException(f"Invalid value for webhdfs parameter \"{name}\": {value!r} {why}")

    def integer(self, name: str, default: int) -> int:
        value = self._values.get(name)
        if value is None or value == "":
            return default
        try:
            return int(value)
        except ValueError:
            raise self._bad(name, value, "is not an integer") from None

    def flag(self, name: str, default: bool) -> bool:
        value = self._values.get(name)
        if value is None or value == "":
            return default
        if value.lower() not in ("true", "false"):
            raise self._bad(name, value, "is not true or false")
        return value.lower() == "true"

    def permission(self, default: int) -> int:
        value = self._values.get("permission")
        if value is None or value == "":
            return default
        try:
            mode = int(value, 8)
        except ValueError:
            raise self._bad("permission", value, "is not an octal number") from None
        if not 0 <= mode <= 0o1777:
            raise self._bad("permission", value, "is outside 0..1777")
        return mode
