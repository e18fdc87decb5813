"""One table says what a bookie's answer to an add means (#23 A3): ``errors.ADD_ANSWERS``.

A request error (the same add would fail on any bookie) fails the append with that
status's error and changes no ensemble; a bookie failure replaces the bookie. Each row
is checked twice: against the expected classification written out here, and by driving
``WriteCore`` with that answer through both of its answer handlers (one answer, and the
batched answers the gRPC transport delivers).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scriba.client.effects import Effects, FailAppends, WriteMetadata
from scriba.client.write_core import WriteConfig, WriteCore
from scriba.client.writer_state import WriterState
from scriba.entry import make_digest
from scriba.errors import (
    ADD_ANSWERS,
    AddAnswer,
    BadRequestError,
    LedgerFencedError,
    NotEnoughBookiesError,
    ScribaError,
    Status,
    UnauthorizedError,
    error_for_status,
)
from scriba.ids import BookieId, EntryId, LedgerId
from scriba.meta.records import LedgerMetadata

ACK, REQUEST, BOOKIE = AddAnswer.ACK, AddAnswer.REQUEST_ERROR, AddAnswer.BOOKIE_FAILURE

EXPECTED: dict[Status, AddAnswer] = {
    Status.OK: ACK,
    Status.NO_SUCH_LEDGER: REQUEST,
    Status.NO_SUCH_ENTRY: BOOKIE,
    Status.FENCED: REQUEST,
    Status.UNAUTHORIZED: REQUEST,
    Status.READ_ONLY: BOOKIE,
    Status.BAD_REQUEST: REQUEST,
    Status.TOO_MANY_REQUESTS: BOOKIE,
    Status.CORRUPT: BOOKIE,
    Status.INTERNAL: BOOKIE,
    Status.TIMEOUT: BOOKIE,
    Status.UNAVAILABLE: BOOKIE,
    Status.BAD_VERSION: BOOKIE,
    Status.NO_SUCH_KEY: BOOKIE,
    Status.KEY_EXISTS: BOOKIE,
    Status.METADATA_UNAVAILABLE: BOOKIE,
    Status.SESSION_EXPIRED: BOOKIE,
    Status.CONFIG: BOOKIE,
    Status.LEDGER_CLOSED: REQUEST,
    Status.NOT_ENOUGH_BOOKIES: BOOKIE,
    Status.DIGEST_MISMATCH: REQUEST,
    Status.VALUE_TOO_LARGE: REQUEST,
    Status.COOKIE_MISMATCH: BOOKIE,
    Status.STORAGE: BOOKIE,
    Status.LEDGER_EXISTS: BOOKIE,
    Status.NOT_LEADER: BOOKIE,
    Status.ENTRY_TOO_LARGE: REQUEST,
}
ERRORS = [s for s in Status if s is not Status.OK]


def test_the_table_covers_every_status() -> None:
    assert set(ADD_ANSWERS) == set(Status) == set(EXPECTED)


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.name)
def test_row(status: Status) -> None:
    assert ADD_ANSWERS[status] is EXPECTED[status]


class Spares:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ensemble: tuple[BookieId, ...], index: int, exclude: frozenset[BookieId]) -> BookieId:
        self.calls += 1
        for name in ("x", "y", "z"):
            if name not in exclude:
                return BookieId(name)
        raise NotEnoughBookiesError("no spare")


def writer_core() -> tuple[WriteCore, Spares]:
    md = LedgerMetadata(
        ledger_id=LedgerId(7), ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
        ensembles=((EntryId(0), (BookieId("a"), BookieId("b"), BookieId("c"))),),
    )
    spares = Spares()
    return WriteCore(md, digest=make_digest("crc32c", b""), choose_replacement=spares, config=WriteConfig()), spares


def one(core: WriteCore, status: Status) -> Effects:
    return core.on_add_response(BookieId("a"), 1, status)


def batched(core: WriteCore, status: Status) -> Effects:
    return core.on_add_responses(BookieId("a"), [0, 1], status)


HANDLERS: dict[str, Callable[[WriteCore, Status], Effects]] = {"one": one, "batched": batched}


@pytest.mark.parametrize("handler", list(HANDLERS))
@pytest.mark.parametrize("status", ERRORS, ids=lambda s: s.name)
def test_write_core_follows_the_row(status: Status, handler: str) -> None:
    core, spares = writer_core()
    for payload in (b"zero", b"one"):
        core.append(payload)
    effects = list(HANDLERS[handler](core, status))
    fails = [e for e in effects if isinstance(e, FailAppends)]
    changes = [e for e in effects if isinstance(e, WriteMetadata)]
    if EXPECTED[status] is REQUEST:
        assert changes == [] and spares.calls == 0  # no ensemble change
        (fail,) = fails
        assert (fail.first, fail.last) == (0, 1)
        assert type(fail.error) is type(error_for_status(status))
        assert core.state is WriterState.FAILED and core.error is fail.error
        assert "bookie a" in str(fail.error)
    else:
        assert fails == [] and spares.calls == 1
        assert [c.purpose for c in changes] == ["ensemble_change"]
        assert core.state is WriterState.OPEN


@pytest.mark.parametrize(
    ("status", "error"),
    [(Status.UNAUTHORIZED, UnauthorizedError), (Status.FENCED, LedgerFencedError),
     (Status.BAD_REQUEST, BadRequestError)],
)
def test_a_late_request_error_still_fails_the_writer(status: Status, error: type[ScribaError]) -> None:
    """An entry already confirmed by the rest of its write set, then refused by one bookie:
    the refusal still stops the writer (a bookie failure there would replace the bookie)."""
    core, spares = writer_core()
    core.append(b"zero")
    core.on_add_response(BookieId("b"), 0, Status.OK)
    core.on_add_response(BookieId("c"), 0, Status.OK)
    assert core.last_add_confirmed == 0
    core.append(b"one")
    effects = core.on_add_response(BookieId("a"), 0, status)
    (fail,) = effects
    assert isinstance(fail, FailAppends) and isinstance(fail.error, error)
    assert (fail.first, fail.last) == (1, 1) and spares.calls == 0
    # The writer can still close at its last confirmed entry (unless deposed or refused a key).
    if error is BadRequestError:
        (close,) = core.close()
        assert isinstance(close, WriteMetadata) and close.purpose == "close"
    else:
        with pytest.raises(error):
            core.close()


@pytest.mark.parametrize("handler", list(HANDLERS))
@pytest.mark.parametrize(
    "late", [Status.UNAUTHORIZED, Status.BAD_REQUEST, Status.FENCED, Status.TIMEOUT], ids=lambda s: s.name
)
def test_late_answers_after_a_failure_change_nothing_while_it_closes(late: Status, handler: str) -> None:
    """A writer failed by one bookie's refusal, then closed by its owner: the other bookies'
    answers to the same (already failed) entries arrive during the close. They must not
    fail the entries again (the driver holds no futures for them any more) nor start an
    ensemble change; the close completes."""
    core, spares = writer_core()
    for payload in (b"zero", b"one"):
        core.append(payload)
    (fail,) = core.on_add_response(BookieId("a"), 0, Status.BAD_REQUEST)
    assert isinstance(fail, FailAppends) and (fail.first, fail.last) == (0, 1)
    (close,) = core.close()
    assert isinstance(close, WriteMetadata) and close.purpose == "close"
    assert list(HANDLERS[handler](core, late)) == []
    assert list(core.on_add_responses(BookieId("c"), [0, 1], Status.OK)) == []
    assert core.state is WriterState.CLOSING and spares.calls == 0
    closed = close.transform(core.metadata)
    assert list(core.on_metadata_written(closed)) == []
    assert core.state is WriterState.CLOSED and closed.last_entry_id == -1
