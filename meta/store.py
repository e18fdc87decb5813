"""The metadata store interface: one async API, three drivers (memory, etcd, ZooKeeper).

Keys are ``/``-separated paths relative to the store's root (the URI's prefix or
chroot), e.g. ``ledgers/00000000000000000042``. Records listed under one prefix are
one level deep (``list("ledgers/")``), so etcd's prefix ranges and ZooKeeper's
children mean the same thing.

Versions are opaque integers that change on every write of a key (etcd
mod_revision, ZooKeeper stat.version, a counter in memory); compare-and-set
compares them. ``created`` is the store-wide, strictly increasing revision at which
the key was created (etcd create_revision, ZooKeeper czxid): a fencing token.
``owner`` is the ``session_id`` of the session an ephemeral record belongs to (etcd's
lease, ZooKeeper's ephemeralOwner, in the form ``Session.session_id`` takes) and ``""``
for a persistent record: a create whose answer was lost is recognised as one's own.

Ephemeral records belong to the store's :class:`Session`. The session reports
CONNECTED / SUSPENDED / LOST to whoever holds ephemerals or leadership:
SUSPENDED means "do not trust what you hold"; LOST means "your ephemerals are
gone". After LOST the driver opens a new session (new ``session_id``) and reports
CONNECTED again; holders re-create what they need.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

T = TypeVar("T")

VALUE_SIZE_MAX: Final = 1024 * 1024
"""Largest value any driver accepts (ZooKeeper's jute.maxbuffer default is ~1 MiB)."""


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    value: T
    version: int
    created: int = 0
    owner: str = ""  # an ephemeral's session_id; "" for a persistent record


class SessionState(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"
    SYNCED = "synced"  # the initial state has been delivered; changes follow


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: EventKind
    key: str = ""
    value: bytes | None = None  # None for DELETE and SYNCED
    version: int = 0


@dataclass(frozen=True, slots=True)
class Check:
    """A transaction check: ``key`` is at ``version`` (``None``: the key must not exist)."""

    key: str
    version: int | None


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


SessionListener = Callable[[SessionState], None]


class Session(Protocol):
    @property
    def state(self) -> SessionState: ...

    @property
    def session_id(self) -> str:
        """Changes when a new session replaces a LOST one."""
        ...

    def add_listener(self, listener: SessionListener) -> None:
        """Call ``listener(state)`` on the event loop at every state change."""
        ...

    def remove_listener(self, listener: SessionListener) -> None: ...


class MetadataStore(Protocol):
    """The operations every driver provides. All raise errors from ``scriba.errors``."""

    uri: str

    @property
    def session(self) -> Session: ...

    async def get(self, key: str) -> Versioned[bytes]:
        """The value and version; ``NoSuchKeyError`` if absent."""
        ...

    async def create(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        """Create ``key``; ``KeyExistsError`` if present. Returns the new version."""
        ...

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        """Compare-and-set; ``BadVersionError`` on a lost race, ``NoSuchKeyError`` if absent."""
        ...

    async def delete(self, key: str, *, expected_version: int | None = None) -> None:
        """Delete (conditionally); ``NoSuchKeyError`` if absent, ``BadVersionError`` on a race."""
        ...

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[tuple[str, Versioned[bytes]]]:
        """Records directly under ``prefix`` (ending in ``/``), sorted by key, one page."""
        ...

    def scan(self, prefix: str, *, page_size: int = 500) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        """Every record under ``prefix``, sorted, fetched a page at a time."""
        ...

    def watch(self, key: str, *, prefix: bool = False) -> AsyncGenerator[WatchEvent, None]:
        """Current state first (a PUT per existing key), then SYNCED, then every change.

        Per key, events arrive in version order and the last one delivered is the
        current value; nothing is missed across a reconnect (the driver re-syncs).
        Closing the iterator (``aclose``) cancels the watch.
        """
        ...

    async def txn(self, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
        """All writes if every check holds, else none and ``BadVersionError``."""
        ...

    async def allocate_id(self, name: str) -> int:
        """A unique id from the 63-bit sequence ``name``: never 0, never reused (even after
        crashes), strictly increasing per store. Not dense: each store reserves ranges
        (``scriba.meta.id_ranges``) and what a closed or crashed store left unused is skipped."""
        ...

    async def close(self) -> None:
        """End the session (its ephemerals go promptly) and release connections."""
        ...

    async def __aenter__(self) -> MetadataStore: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


# --- input checks shared by every driver (additive; same errors on all drivers) ---


def check_key(key: str) -> str:
    """A record key: ``/``-separated, non-empty segments, no leading or trailing ``/``."""
    from scriba.errors import BadRequestError

    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/"):
        raise BadRequestError(f"bad metadata key {key!r}: expected 'a/b/c' (no leading or trailing /)")
    if "" in key.split("/") or "\x00" in key:
        raise BadRequestError(f"bad metadata key {key!r}: empty segment or NUL")
    return key


def check_prefix(prefix: str) -> str:
    """A listing/watch prefix: ``""`` (the root) or a key followed by ``/``."""
    from scriba.errors import BadRequestError

    if prefix == "":
        return prefix
    if not isinstance(prefix, str) or not prefix.endswith("/"):
        raise BadRequestError(f"bad metadata prefix {prefix!r}: expected '' or 'a/b/'")
    check_key(prefix[:-1])
    return prefix


def check_value(key: str, value: bytes) -> bytes:
    """``ValueTooLargeError`` above :data:`VALUE_SIZE_MAX` (every driver, before any I/O)."""
    from scriba.errors import BadRequestError, ValueTooLargeError

    if not isinstance(value, bytes | bytearray | memoryview):
        raise BadRequestError(f"{key}: value must be bytes, got {type(value).__name__}")
    if len(value) > VALUE_SIZE_MAX:
        raise ValueTooLargeError(f"{key}: value of {len(value)} bytes exceeds the {VALUE_SIZE_MAX}-byte limit")
    return bytes(value)


def is_direct_child(prefix: str, key: str) -> bool:
    """True if ``key`` lies directly under ``prefix`` (one level deep)."""
    return key.startswith(prefix) and len(key) > len(prefix) and "/" not in key[len(prefix) :]
