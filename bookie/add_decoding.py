"""Adds as they come off the wire, decoded into storage columns, and their answers (no I/O).

``BookieService`` takes each ``AddBatch`` through five steps: refuse (the whole message:
too many adds, bookie not serving) -> **decode** (here) -> bound (the connection's
in-flight bytes) -> store (``storage.add_columns``) -> **answer** (here). Both wire forms
decode to one shape, :class:`DecodedAdds`, so every step after decoding is written once:

- runs (``AddRun``: one ledger's adds packed in one bytes field; the clients' hot path;
  the binary path's runs decode to the same attributes, see ``RunLike``).
  A malformed run (counts or lengths that do not add up, bad ids, no key) is answered
  BAD_REQUEST whole; the entries of the others are sliced out of their blobs. A message
  of one good run hands storage the run's blob and sizes as they came (no join). Answers
  are one ``AddRunResponse`` per run and status.
- single adds (``AddRequest``). Each is checked alone (size bounds, header ids equal the
  request's, ids in range, a key). The answer holds one ``AddResponse`` per add, in
  order, built while decoding with status OK; only non-OK answers are patched later.

What the entries mean (master key, fencing, duplicates) is storage's to judge, as for
any add. Invariant: every add of the message gets exactly one answer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate, chain, repeat
from typing import Any, Final, Protocol

from scriba.bookie.storage_api import AddColumns
from scriba.entry import HEADER_SIZE
from scriba.errors import Status
from scriba.ids import LEDGER_ID_MAX
from scriba.proto import scriba_pb2 as pb

_IDS: Final = struct.Struct(">Qq")  # the ledger id and entry id at the front of a packed entry
_WIRE_STATUS_MAX: Final = int(Status.UNAVAILABLE)
# wire codes as plain ints (the generated stubs type them as the proto enum)
_OK: Final[Any] = int(Status.OK)
_BAD_REQUEST: Final[Any] = int(Status.BAD_REQUEST)
_INTERNAL: Final[Any] = int(Status.INTERNAL)


class RunLike(Protocol):
    """A run of adds as either wire delivers it: ``pb.AddRun`` or the binary path's
    ``scriba.proto.binary.Run`` (the same attribute names)."""

    @property
    def ledger_id(self) -> int: ...
    @property
    def master_key(self) -> bytes: ...
    @property
    def flags(self) -> int: ...
    @property
    def entry_ids(self) -> Sequence[int]: ...
    @property
    def sizes(self) -> Sequence[int]: ...
    @property
    def entries(self) -> bytes: ...


def wire_status(status: int) -> int:
    """A status the wire enum knows (client/metadata-only codes become INTERNAL)."""
    return status if 0 <= status <= _WIRE_STATUS_MAX else _INTERNAL


def answer_message(
    response: pb.AddResponseBatch, adds: Sequence[pb.AddRequest], runs: Sequence[RunLike],
    status: int, message: str,
) -> None:
    """Answer every add of a message with one status (a refusal, a failure)."""
    add = response.responses.add
    for a in adds:
        add(ledger_id=a.ledger_id, entry_id=a.entry_id, status=status, message=message)
    for run in runs:
        if run.entry_ids:
            answer = response.runs.add()
            answer.ledger_id = run.ledger_id
            answer.entry_ids.extend(run.entry_ids)
            answer.status = status
            answer.message = message


class DecodedAdds:
    """One message after decoding: its well-formed adds as storage columns.

    ``response`` already answers the ``rejected`` malformed adds; ``columns`` holds the
    ``count`` others (``nbytes`` bytes of entries; None when there are none), which
    :meth:`answer_all` or :meth:`answer_each` answer once storage has spoken.
    """

    __slots__ = ("columns", "count", "nbytes", "rejected", "response")

    def __init__(self, response: pb.AddResponseBatch, columns: AddColumns | None, nbytes: int,
                 rejected: int) -> None:
        self.response = response
        self.columns = columns
        self.count = 0 if columns is None else len(columns)
        self.nbytes = nbytes
        self.rejected = rejected

    def answer_all(self, status: int, message: str) -> None:
        """Answer every add of ``columns`` with one status."""
        raise NotImplementedError

    def answer_each(self, statuses: Sequence[int]) -> None:
        """Answer each add of ``columns`` with its own status from storage."""
        raise NotImplementedError


class _DecodedRuns(DecodedAdds):
    __slots__ = ("_entry_ids", "_good")

    def __init__(self, response: pb.AddResponseBatch, columns: AddColumns | None, nbytes: int,
                 rejected: int, good: list[tuple[int, int]], entry_ids: list[int]) -> None:
        super().__init__(response, columns, nbytes, rejected)
        self._good = good  # (ledger id, number of adds) of each run in the columns
        self._entry_ids = entry_ids

    def answer_all(self, status: int, message: str) -> None:
        new = self.response.runs.add
        eids = self._entry_ids
        start = 0
        for lid, n in self._good:
            answer = new()
            answer.ledger_id = lid
            answer.entry_ids.extend(eids[start : start + n])
            if status != _OK:
                answer.status = status
                answer.message = message
            start += n

    def answer_each(self, statuses: Sequence[int]) -> None:
        """One answer per run and distinct status."""
        new = self.response.runs.add
        eids = self._entry_ids
        start = 0
        for lid, n in self._good:
            groups: dict[int, list[int]] = {}
            for eid, st in zip(eids[start : start + n], statuses[start : start + n], strict=True):
                groups.setdefault(int(st), []).append(eid)
            for st, group in groups.items():
                answer = new()
                answer.ledger_id = lid
                answer.entry_ids.extend(group)
                if st != _OK:
                    answer.status = wire_status(st)
                    answer.message = Status(st).name
            start += n


class _DecodedSingles(DecodedAdds):
    __slots__ = ("_targets",)

    def __init__(self, response: pb.AddResponseBatch, columns: AddColumns | None, nbytes: int,
                 rejected: int, targets: list[Any]) -> None:
        super().__init__(response, columns, nbytes, rejected)
        self._targets = targets  # the answer of each add in the columns (status OK so far)

    def answer_all(self, status: int, message: str) -> None:
        if status == _OK:
            return  # already said
        for r in self._targets:
            r.status = status
            r.message = message

    def answer_each(self, statuses: Sequence[int]) -> None:
        for r, st in zip(self._targets, statuses, strict=True):
            if st != _OK:
                r.status = wire_status(int(st))
                r.message = Status(int(st)).name


def _run_problem(ledger_id: int, master_key: bytes, entry_ids: list[int], sizes: list[int], blob_bytes: int) -> str:
    """What makes a run malformed as a whole ('' when nothing does)."""
    if len(sizes) != len(entry_ids):
        return f"run of ledger {ledger_id}: {len(entry_ids)} entry ids but {len(sizes)} sizes"
    if sum(sizes) != blob_bytes:
        return f"run of ledger {ledger_id}: sizes add up to {sum(sizes)} bytes, entries hold {blob_bytes}"
    if ledger_id > LEDGER_ID_MAX or min(entry_ids) < 0:
        return f"run of ledger {ledger_id}: invalid ids (entry ids {min(entry_ids)}..{max(entry_ids)})"
    if not master_key:
        return f"run of ledger {ledger_id}: master key missing"
    return ""


def _with_recovery(recovery: list[bool] | None, flagged: bool, before: int, n: int) -> list[bool] | None:
    """The recovery column after ``n`` more adds (``before`` adds already in the columns);
    None as long as no add is a recovery add."""
    if flagged:
        if recovery is None:
            recovery = [False] * before
        recovery += repeat(True, n)
    elif recovery is not None:
        recovery += repeat(False, n)
    return recovery


def decode_runs(runs: Sequence[RunLike]) -> DecodedAdds:
    """Decode a message's runs: malformed ones answered, the others' entries in columns."""
    response = pb.AddResponseBatch()
    lids: list[int] = []
    eids: list[int] = []
    keys: list[bytes] = []
    entries: list[bytes] = []
    recovery: list[bool] | None = None
    good: list[tuple[int, int]] = []  # (ledger id, number of adds) of each run sent on
    one: tuple[bytes, list[int]] = (b"", [])  # the blob and sizes of the last good run
    nbytes = 0
    rejected = 0
    for run in runs:
        ids = list(run.entry_ids)
        n = len(ids)
        if not n:
            continue
        blob = run.entries
        sizes = list(run.sizes)
        lid = run.ledger_id
        problem = _run_problem(lid, run.master_key, ids, sizes, len(blob))
        if problem:
            answer = response.runs.add()
            answer.ledger_id = lid
            answer.entry_ids.extend(ids)
            answer.status = _BAD_REQUEST
            answer.message = problem
            rejected += n
            continue
        ends = list(accumulate(sizes))
        entries += map(blob.__getitem__, map(slice, chain((0,), ends), ends))
        lids += repeat(lid, n)
        eids += ids
        keys += repeat(run.master_key, n)
        if run.flags & 1 or recovery is not None:
            recovery = _with_recovery(recovery, bool(run.flags & 1), len(entries) - n, n)
        good.append((lid, n))
        one = (blob, sizes)
        nbytes += ends[-1]
    columns = None
    if len(good) == 1:  # the common message: storage journals the run's blob as is
        columns = AddColumns(lids, eids, keys, entries, recovery, blob=one[0], sizes=one[1])
    elif good:
        columns = AddColumns(lids, eids, keys, entries, recovery)
    return _DecodedRuns(response, columns, nbytes, rejected, good, eids)


def decode_adds(adds: Sequence[pb.AddRequest], entry_size_max: int) -> DecodedAdds:
    """Decode a message's single adds: one answer each, the good ones in columns.

    One pass, no object per add but the response's own: parallel lists for storage.
    """
    response = pb.AddResponseBatch()
    new = response.responses.add
    unpack = _IDS.unpack_from
    lids: list[int] = []
    eids: list[int] = []
    keys: list[bytes] = []
    entries: list[bytes] = []
    recovery: list[bool] | None = None
    targets: list[Any] = []
    rejected = 0
    nbytes = 0
    for a in adds:
        entry = a.entry
        lid = a.ledger_id
        eid = a.entry_id
        r = new()
        r.ledger_id = lid
        r.entry_id = eid
        size = len(entry)
        key = a.master_key
        if size < HEADER_SIZE or size > entry_size_max:
            message = f"entry of {size} bytes (allowed {HEADER_SIZE}..{entry_size_max})"
        elif unpack(entry) != (lid, eid):
            message = f"entry header names {unpack(entry)}, request ({lid}, {eid})"
        elif eid < 0 or lid > LEDGER_ID_MAX:
            message = f"invalid ids ledger {lid} entry {eid}"
        elif not key:
            message = "master key missing"
        else:
            nbytes += size
            if a.flags & 1 or recovery is not None:
                recovery = _with_recovery(recovery, bool(a.flags & 1), len(entries), 1)
            lids.append(lid)
            eids.append(eid)
            keys.append(key)
            entries.append(entry)
            targets.append(r)
            continue
        r.status = _BAD_REQUEST
        r.message = message
        rejected += 1
    columns = AddColumns(lids, eids, keys, entries, recovery) if entries else None
    return _DecodedSingles(response, columns, nbytes, rejected, targets)
