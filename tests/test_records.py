"""Metadata records: codecs, write sets, and the compare-and-set update loop."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from scriba.errors import BadRequestError, BadVersionError, NoSuchKeyError
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.invariant import InvariantViolation
from scriba.meta.records import (
    LEDGER_CODEC,
    BookieMode,
    BookieRegistration,
    Cookie,
    LedgerMetadata,
    LedgerState,
    ledger_id_from_key,
    ledger_key,
)
from scriba.meta.store import Versioned
from scriba.meta.update import update_metadata

B = [BookieId(f"b{i}") for i in range(5)]


def ledger(**changes: object) -> LedgerMetadata:
    base = LedgerMetadata(
        ledger_id=LedgerId(42),
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        ensembles=((EntryId(0), (B[0], B[1], B[2])), (EntryId(10), (B[0], B[3], B[2]))),
        password_hash=b"\x01\x02",
        custom_metadata={"app": "test"},
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_ledger_metadata_round_trips() -> None:
    md = ledger(state=LedgerState.CLOSED, last_entry_id=EntryId(17), length=1234)
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md


def test_write_sets_rotate_round_robin_and_follow_segments() -> None:
    md = ledger()
    assert md.write_set(0) == (B[0], B[1])
    assert md.write_set(2) == (B[2], B[0])
    assert md.write_set(9) == (B[0], B[1])
    assert md.write_set(10) == (B[3], B[2])  # segment 2: ensemble (b0, b3, b2), 10 % 3 == 1
    assert md.ensemble_at(11) == (B[0], B[3], B[2])
    assert md.bookies() == {B[0], B[1], B[2], B[3]}


def test_quorums_are_checked() -> None:
    with pytest.raises(InvariantViolation):
        ledger(ack_quorum_size=3)


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"kind": "bookie"}', b'{"kind": "ledger", "format": 1}'])
def test_malformed_ledger_metadata_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(BadRequestError):
        LedgerMetadata.from_bytes(data)


def test_newer_format_is_refused() -> None:
    raw = ledger().to_bytes().replace(b'"format": 1', b'"format": 99')
    with pytest.raises(BadRequestError, match="newer"):
        LedgerMetadata.from_bytes(raw)


def test_bookie_registration_and_cookie_round_trip() -> None:
    reg = BookieRegistration(B[1], "127.0.0.1:3181", "eu", "eu-a", "r1", BookieMode.READ_ONLY, 5, 10)
    assert BookieRegistration.from_bytes(reg.to_bytes()) == reg
    assert reg.location == "/eu/eu-a/r1" and not reg.writable
    cookie = Cookie(B[1], "abc", ("/j",), ("/l",))
    assert Cookie.from_bytes(cookie.to_bytes()) == cookie


def test_ledger_keys_sort_numerically() -> None:
    keys = [ledger_key(i) for i in (2, 10, 1)]
    assert sorted(keys) == [ledger_key(1), ledger_key(2), ledger_key(10)]
    assert ledger_id_from_key(ledger_key(10)) == 10


class RacingStore:
    """A minimal store whose first ``conflicts`` CAS writes lose to a concurrent writer."""

    def __init__(self, value: bytes, conflicts: int) -> None:
        self.value, self.version, self.conflicts, self.writes = value, 1, conflicts, 0

    async def get(self, key: str) -> Versioned[bytes]:
        return Versioned(self.value, self.version)

    async def set(self, key: str, value: bytes, *, expected_version: int) -> int:
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1  # someone else wrote: our expected version is now stale
        if expected_version != self.version:
            raise BadVersionError(key)
        self.value, self.version, self.writes = value, self.version + 1, self.writes + 1
        return self.version


def close_at(entry: int):  # type: ignore[no-untyped-def]
    return lambda md: dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=EntryId(entry))


def test_update_loop_retries_lost_races_then_writes_once() -> None:
    store = RacingStore(ledger().to_bytes(), conflicts=3)
    result = asyncio.run(
        update_metadata(store, "k", LEDGER_CODEC, lambda md: not md.is_closed, close_at(5))  # type: ignore[arg-type]
    )
    assert result.value.state is LedgerState.CLOSED and result.value.last_entry_id == 5
    assert store.writes == 1 and LedgerMetadata.from_bytes(store.value) == result.value


def test_update_loop_skips_when_no_update_is_needed() -> None:
    store = RacingStore(ledger(state=LedgerState.CLOSED).to_bytes(), conflicts=0)
    asyncio.run(update_metadata(store, "k", LEDGER_CODEC, lambda md: not md.is_closed, close_at(5)))  # type: ignore[arg-type]
    assert store.writes == 0


def test_update_loop_gives_up_after_a_bounded_number_of_races() -> None:
    store = RacingStore(ledger().to_bytes(), conflicts=100)
    with pytest.raises(BadVersionError, match="gave up"):
        asyncio.run(
            update_metadata(store, "k", LEDGER_CODEC, lambda md: True, close_at(1), attempts_max=4)  # type: ignore[arg-type]
        )


def test_no_such_key_message_is_readable() -> None:
    assert str(NoSuchKeyError("ledgers/1 not found")) == "ledgers/1 not found"
