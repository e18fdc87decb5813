"""One error tree for all of Scriba.

Every failure a caller can meet is a subclass of :class:`ScribaError`. Each leaf
carries the wire ``status`` it maps to (the ``Status`` enum of ``scriba/proto``)
and ``retriable``: whether the same call may succeed if tried again unchanged.
Retry policy follows the error, not the call site (``tenacity`` retries only
errors with ``retriable = True``, always with a bound).

Leaves are registered by status code, so a wire status becomes exactly one
exception type (:func:`error_for_status`).

What a bookie's answer to an add means to a writer is one table, :data:`ADD_ANSWERS`:
an acknowledgement, a *request error* (the same add would fail on any bookie, so the
append fails with that status's error), or a *bookie failure* (this bookie cannot take
it now: the writer replaces the bookie). Only a bookie failure may cause an ensemble
change: moving a refused add to a fresh bookie would hide the refusal (a wrong master
key would be accepted by a bookie that has never seen the ledger).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import ClassVar, Final


class Status(IntEnum):
    """Status codes shared by the wire protocol and the error tree.

    The numbers equal those of ``scriba.v1.Status`` in ``scriba/proto/scriba.proto``
    (a test keeps them equal). Codes are only ever added.
    """

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4
    READ_ONLY = 5
    BAD_REQUEST = 6
    TOO_MANY_REQUESTS = 7
    CORRUPT = 8
    INTERNAL = 9
    TIMEOUT = 10
    UNAVAILABLE = 11
    # Client-side and metadata codes (never sent by a bookie, but one space for all).
    BAD_VERSION = 100
    NO_SUCH_KEY = 101
    KEY_EXISTS = 102
    METADATA_UNAVAILABLE = 103
    SESSION_EXPIRED = 104
    CONFIG = 105
    LEDGER_CLOSED = 106
    NOT_ENOUGH_BOOKIES = 107
    DIGEST_MISMATCH = 108
    VALUE_TOO_LARGE = 109
    COOKIE_MISMATCH = 110
    STORAGE = 111
    LEDGER_EXISTS = 112
    NOT_LEADER = 113
    ENTRY_TOO_LARGE = 114


_BY_STATUS: dict[Status, type[ScribaError]] = {}


class ScribaError(Exception):
    """Root of every Scriba error."""

    status: ClassVar[Status] = Status.INTERNAL
    retriable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # The first class declared for a status is the one a wire status maps to.
        if "status" in cls.__dict__:
            _BY_STATUS.setdefault(cls.status, cls)


def error_for_status(status: int, message: str = "") -> ScribaError:
    """The exception for a non-OK wire status (unknown codes become InternalError)."""
    try:
        code = Status(status)
    except ValueError:
        return InternalError(f"unknown status {status}: {message}")
    if code is Status.OK:
        raise ValueError("OK is not an error")
    cls = _BY_STATUS.get(code, InternalError)
    return cls(message or code.name)


class InternalError(ScribaError):
    """A bug or an unexpected failure on the other side."""

    status = Status.INTERNAL


class ConfigError(ScribaError, ValueError):
    """A configuration value or URI is invalid. Fix the input; retrying cannot help."""

    status = Status.CONFIG


class BadRequestError(ScribaError):
    """A malformed request: the peer broke the protocol."""

    status = Status.BAD_REQUEST


class DeadlineExceededError(ScribaError):
    """A deadline passed. The operation's outcome is unknown (indeterminate)."""

    status = Status.TIMEOUT
    retriable = True


class UnavailableError(ScribaError):
    """A server could not be reached."""

    status = Status.UNAVAILABLE
    retriable = True


# --- metadata ---------------------------------------------------------------


class MetadataError(ScribaError):
    """Base of metadata-store errors."""


class BadVersionError(MetadataError):
    """A compare-and-set lost: the record changed since it was read. Re-read and retry."""

    status = Status.BAD_VERSION


class NoSuchKeyError(MetadataError, KeyError):
    """The key does not exist."""

    status = Status.NO_SUCH_KEY

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return Exception.__str__(self)


class KeyExistsError(MetadataError):
    """A create found the key already present."""

    status = Status.KEY_EXISTS


class MetadataUnavailableError(MetadataError):
    """The metadata store cannot be reached (the message names the address)."""

    status = Status.METADATA_UNAVAILABLE
    retriable = True


class SessionExpiredError(MetadataError):
    """The session holding ephemerals or leases is gone; so are its ephemerals."""

    status = Status.SESSION_EXPIRED


class ValueTooLargeError(MetadataError):
    """A metadata value exceeds the documented size limit."""

    status = Status.VALUE_TOO_LARGE


class NotLeaderError(MetadataError):
    """The caller no longer holds leadership (its fencing token is stale)."""

    status = Status.NOT_LEADER


# --- ledgers and bookies -----------------------------------------------------


class NoSuchLedgerError(ScribaError):
    status = Status.NO_SUCH_LEDGER


class LedgerExistsError(ScribaError):
    status = Status.LEDGER_EXISTS


class NoSuchEntryError(ScribaError):
    status = Status.NO_SUCH_ENTRY


class LedgerFencedError(ScribaError):
    """The ledger was fenced by a recovering reader: this writer is no longer its writer.

    An add that failed this way is indeterminate: it may or may not be in the ledger.
    """

    status = Status.FENCED


class LedgerClosedError(ScribaError):
    status = Status.LEDGER_CLOSED


class UnauthorizedError(ScribaError):
    """Wrong password / master key, or an unauthenticated caller."""

    status = Status.UNAUTHORIZED


class BookieReadOnlyError(ScribaError):
    """The bookie accepts reads only (disk full, disk error, or operator choice)."""

    status = Status.READ_ONLY
    retriable = True


class TooManyRequestsError(ScribaError):
    """Back-pressure: the bookie's in-flight limit is reached. Retry later."""

    status = Status.TOO_MANY_REQUESTS
    retriable = True


class CorruptEntryError(ScribaError):
    """A stored entry failed its checksum on the bookie."""

    status = Status.CORRUPT


class DigestMismatchError(ScribaError):
    """An entry's digest did not verify on the client (every replica was bad)."""

    status = Status.DIGEST_MISMATCH


class NotEnoughBookiesError(ScribaError):
    """Placement could not meet its constraints; the message names the constraint and counts."""

    status = Status.NOT_ENOUGH_BOOKIES
    retriable = True


class CookieMismatchError(ScribaError):
    """A bookie's data dir does not match its registered cookie (wiped or swapped disk)."""

    status = Status.COOKIE_MISMATCH


class StorageError(ScribaError):
    """A disk operation failed (EIO, failed fsync). Nothing after it is acknowledged."""

    status = Status.STORAGE


class EntryTooLargeError(ScribaError, ValueError):
    """A payload larger than the bookies accept (the message names both sizes).

    Refused by the client before anything was sent: the ledger goes on. Split the
    payload, or raise the bookies' ``entry_size_max`` (advertised in their registrations).
    """

    status = Status.ENTRY_TOO_LARGE


# --- what an answer to an add means -------------------------------------------------


class AddAnswer(enum.Enum):
    ACK = "ack"
    REQUEST_ERROR = "request_error"  # any bookie would refuse it: fail the append
    BOOKIE_FAILURE = "bookie_failure"  # this bookie cannot take it now: replace the bookie


_REQUEST: Final = AddAnswer.REQUEST_ERROR
_BOOKIE: Final = AddAnswer.BOOKIE_FAILURE

ADD_ANSWERS: Final[Mapping[Status, AddAnswer]] = MappingProxyType({
    Status.OK: AddAnswer.ACK,
    # The ledger or the request is at fault; another bookie would answer the same.
    Status.FENCED: _REQUEST,  # recovered by another client: this writer is deposed
    Status.UNAUTHORIZED: _REQUEST,  # wrong master key (a fresh bookie would accept it)
    Status.BAD_REQUEST: _REQUEST,  # malformed, or over the bookie's entry_size_max
    Status.NO_SUCH_LEDGER: _REQUEST,  # the ledger is gone (deleted)
    Status.LEDGER_CLOSED: _REQUEST,
    Status.ENTRY_TOO_LARGE: _REQUEST,
    Status.VALUE_TOO_LARGE: _REQUEST,
    Status.DIGEST_MISMATCH: _REQUEST,  # the entry itself is bad
    # This bookie cannot take the add now: down, slow, full, overloaded or broken.
    Status.UNAVAILABLE: _BOOKIE,
    Status.TIMEOUT: _BOOKIE,
    Status.READ_ONLY: _BOOKIE,  # disk full or shutting down
    Status.TOO_MANY_REQUESTS: _BOOKIE,  # over its (or the transport's) in-flight bound
    Status.INTERNAL: _BOOKIE,  # a bug or a failed disk on the bookie
    Status.STORAGE: _BOOKIE,
    Status.CORRUPT: _BOOKIE,
    Status.COOKIE_MISMATCH: _BOOKIE,
    # Never a bookie's answer to an add: a bookie that sends one is broken.
    Status.NO_SUCH_ENTRY: _BOOKIE,
    Status.BAD_VERSION: _BOOKIE,
    Status.NO_SUCH_KEY: _BOOKIE,
    Status.KEY_EXISTS: _BOOKIE,
    Status.METADATA_UNAVAILABLE: _BOOKIE,
    Status.SESSION_EXPIRED: _BOOKIE,
    Status.CONFIG: _BOOKIE,
    Status.NOT_ENOUGH_BOOKIES: _BOOKIE,
    Status.LEDGER_EXISTS: _BOOKIE,
    Status.NOT_LEADER: _BOOKIE,
})
"""Every status, classified as an answer to an add (a test keeps the table total)."""


# --- streams (scriba.stream) ---------------------------------------------------


class StreamError(ScribaError):
    """Base of the log-stream layer's errors."""


class NamespaceNotFoundError(StreamError):
    """No such stream namespace (open it with ``create=True`` to create it)."""


class NamespaceExistsError(StreamError):
    """The namespace already exists."""


class NamespaceNotEmptyError(StreamError):
    """The namespace still holds streams (delete them, or delete recursively)."""


class StreamNotFoundError(StreamError):
    """No such stream in the namespace (or it is being deleted)."""


class StreamExistsError(StreamError):
    """The stream already exists."""


class WriterFencedError(StreamError):
    """A newer writer opened the stream (or this writer lost its lock): it is no longer the writer.

    Appends that failed this way are indeterminate: the new writer's recovery kept
    or dropped them; they are never confirmed to this writer.
    """


class WriterLockedError(StreamError):
    """Another live writer holds the stream's writer lock (timed out waiting for it)."""

    retriable = True


class StreamWriterClosedError(StreamError):
    """The stream writer was closed, or failed earlier (the message says why)."""


class PositionTruncatedError(StreamError):
    """The position lies before the stream's truncation point: its records are gone."""


class PositionOutOfRangeError(StreamError):
    """The position lies beyond the end of the stream."""


class InvalidPositionError(StreamError, ValueError):
    """A position that does not parse (expected ``SEG:ENTRY:SLOT``) or has a bad part."""


class RecordTooLargeError(StreamError):
    """A record (payload + headers) exceeds the stream's ``record_bytes_max``."""


class RecordSetCorruptError(StreamError):
    """A ledger entry is not a valid record set (bad layout, or an unknown format version)."""


class CursorRegressionError(StreamError):
    """A cursor commit would move the cursor backwards (pass ``force=True`` to allow it)."""


# --- replicated state machines (scriba.rsm) -------------------------------------


class RsmError(ScribaError):
    """Base of the replicated-state-machine layer's errors."""


class RsmNotLeaderError(RsmError):
    """This replica is not the leader (and does not forward): ask ``leader_address``.

    Nothing was proposed; sending the same request to the leader is safe.
    """

    retriable = True

    def __init__(self, message: str, *, leader_id: str | None = None, leader_address: str | None = None) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


class CommandOutcomeUnknownError(RsmError):
    """The leader lost leadership (or the call timed out) while the command was in flight.

    The command may or may not be in the log (indeterminate). With a client session,
    retrying the same session and sequence number applies it at most once and returns
    the first result.
    """

    retriable = True


class CommandTooLargeError(RsmError, ValueError):
    """A command (with its envelope) exceeds ``RsmConfig.command_bytes_max``."""


class BadConsistencyError(RsmError, ValueError):
    """A read's consistency level is not one of linearizable / sequential / after."""


class StateMachineError(RsmError):
    """The user's state machine raised in ``apply`` or ``restore``: the replica stopped.

    Determinism is the state machine's contract; a replica whose state may now differ
    from the others' serves nothing more.
    """


class ReplicaStoppedError(RsmError):
    """The replica was stopped (``stop()``, or a fatal error the message names)."""


class ReplicaIdInUseError(RsmError):
    """Another live replica of this state machine already runs with this replica id."""


class ReplicaNotFoundError(RsmError):
    """No live replica with this id (e.g. the target of a leadership transfer)."""


class ClientSessionError(RsmError):
    """A client session cannot take the command (expired, never opened, or its window is
    full); the message says which. Not applied; open a new session."""


class SnapshotCorruptError(RsmError):
    """A snapshot's bytes do not match its recorded digest (or cannot be read/decoded)."""


# The old name of DeadlineExceededError, kept for programs that import it. Imported by that
# name it shadows the builtin ``TimeoutError``; import ``DeadlineExceededError`` instead.
TimeoutError = DeadlineExceededError
