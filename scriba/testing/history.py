"""History recorder: what clients asked for and what they were told, for the checkers.

Records (one JSON object per line when saved):
- ``invoke``: process ``p`` starts operation ``f`` with argument ``value``;
- ``ok``: it completed and took effect; ``value`` is its result;
- ``fail``: it definitely did not take effect (a definite rejection);
- ``info``: indeterminate — it may or may not have taken effect (timeouts,
  fenced adds, lost connections). Checkers treat it as returning at infinity.

Each completion names the ``op_id`` of its invoke; ``time_ns`` is monotonic
nanoseconds (from an injectable clock), ``index`` the record's position. A
process has at most one operation in flight (as in Jepsen); use distinct process
names for concurrent callers.

Histories recorded in separate processes on one machine can be combined with
:meth:`History.merge` (``time.monotonic_ns`` is one clock for the whole machine).

The recorder is safe from many threads and from asyncio tasks (a lock held only
for appends, never across an ``await``), and bounded (``ops_max``).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from scriba import errors
from scriba.invariant import InvariantViolation, invariant

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: tuple[OpType, ...] = ("invoke", "ok", "fail", "info")
OPS_MAX = 1_000_000

# Errors that say the operation definitely did not happen (the server refused it whole).
DEFINITE_FAILURES: tuple[type[BaseException], ...] = (
    errors.UnauthorizedError,
    errors.BadRequestError,
    errors.ConfigError,
    errors.NoSuchLedgerError,
    errors.NoSuchEntryError,
    errors.NoSuchKeyError,
    errors.KeyExistsError,
    errors.BadVersionError,
    errors.LedgerClosedError,
    errors.LedgerExistsError,
    errors.ValueTooLargeError,
    errors.TooManyRequestsError,
)
# Errors after which the outcome is unknown: the operation may have taken effect.
INDETERMINATE: tuple[type[BaseException], ...] = (
    errors.LedgerFencedError,
    errors.DeadlineExceededError,
    errors.UnavailableError,
    errors.MetadataUnavailableError,
    errors.SessionExpiredError,
    errors.NotLeaderError,
    builtins.TimeoutError,
    ConnectionError,
)


def classify_error(
    exc: BaseException, *, definite: tuple[type[BaseException], ...] = ()
) -> Literal["fail", "info"]:
    """``"fail"`` for a definite rejection, ``"info"`` (indeterminate) for everything else.

    Indeterminate is the safe default: a checker may only treat an operation as
    not having happened when the error proves it. ``definite`` adds caller-known
    definite failures. Timeouts and fencing are always ``"info"``.
    """
    if isinstance(exc, INDETERMINATE):
        return "info"
    if isinstance(exc, DEFINITE_FAILURES + definite):
        return "fail"
    return "info"


@dataclass(frozen=True, slots=True)
class Op:
    """One history record."""

    type: OpType
    process: str
    f: str
    value: Any
    time_ns: int
    op_id: int
    index: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Op:
        invariant(obj.get("type") in OP_TYPES, f"bad op type in {obj!r}")
        return Op(
            type=obj["type"], process=str(obj["process"]), f=str(obj["f"]), value=obj.get("value"),
            time_ns=int(obj["time_ns"]), op_id=int(obj["op_id"]), index=int(obj["index"]),
            error=obj.get("error"),
        )


@dataclass(frozen=True, slots=True)
class OpPair:
    """An invoke and its completion (None: never completed, i.e. indeterminate)."""

    invoke: Op
    completion: Op | None

    @property
    def status(self) -> OpType:
        return self.completion.type if self.completion is not None else "info"


class History:
    """An append-only, thread- and asyncio-safe list of :class:`Op` records."""

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns, *, ops_max: int = OPS_MAX) -> None:
        invariant(ops_max > 0, "ops_max must be positive")
        self._clock_ns = clock_ns
        self._ops_max = ops_max
        self._ops: list[Op] = []
        self._open: dict[int, Op] = {}  # op_id -> invoke
        self._busy: dict[str, int] = {}  # process -> op_id in flight
        self._next_id = 0
        self._lock = threading.Lock()

    # --- recording ---
    def invoke(self, process: str | int, f: str, value: Any = None) -> int:
        """Record an invoke; returns its ``op_id`` for the completion."""
        proc = str(process)
        with self._lock:
            invariant(proc not in self._busy, f"process {proc} already has op {self._busy.get(proc)} in flight")
            op_id = self._next_id
            self._next_id += 1
            op = self._append("invoke", proc, f, value, op_id, None)
            self._open[op_id] = op
            self._busy[proc] = op_id
            return op_id

    def ok(self, op_id: int, value: Any = None) -> None:
        self._complete("ok", op_id, value, None)

    def fail(self, op_id: int, error: str | BaseException | None = None, value: Any = None) -> None:
        self._complete("fail", op_id, value, _error_text(error))

    def info(self, op_id: int, error: str | BaseException | None = None, value: Any = None) -> None:
        self._complete("info", op_id, value, _error_text(error))

    def error(self, op_id: int, exc: BaseException, *, definite: tuple[type[BaseException], ...] = ()) -> OpType:
        """Complete with ``fail`` or ``info`` as :func:`classify_error` decides; returns which."""
        kind = classify_error(exc, definite=definite)
        self._complete(kind, op_id, None, _error_text(exc))
        return kind

    @contextlib.contextmanager
    def op(self, process: str | int, f: str, value: Any = None) -> Iterator[Completion]:
        """``with history.op(p, "write", 3) as done: ...; done.ok(result)``.

        An exception inside the block completes the op through :meth:`error` and
        propagates; a block that exits without completing records ``info``.
        """
        done = Completion(self, self.invoke(process, f, value))
        try:
            yield done
        except BaseException as exc:
            if not done.completed:
                if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                    done.info(exc)
                else:
                    self.error(done.op_id, exc)
                    done.completed = True
            raise
        if not done.completed:
            done.info("completed without a result")

    def _complete(self, kind: OpType, op_id: int, value: Any, error: str | None) -> None:
        with self._lock:
            invoke = self._open.pop(op_id, None)
            if invoke is None:
                raise InvariantViolation(f"op {op_id} is not in flight")
            del self._busy[invoke.process]
            self._append(kind, invoke.process, invoke.f, value, op_id, error)

    def _append(self, kind: OpType, process: str, f: str, value: Any, op_id: int, error: str | None) -> Op:
        invariant(len(self._ops) < self._ops_max, f"history is full ({self._ops_max} records)")
        op = Op(kind, process, f, value, self._clock_ns(), op_id, len(self._ops), error)
        self._ops.append(op)
        return op

    # --- reading ---
    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def __len__(self) -> int:
        return len(self._ops)

    def pairs(self) -> list[OpPair]:
        """Invokes in order, each with its completion (None if it never completed)."""
        completions: dict[int, Op] = {}
        invokes: list[Op] = []
        for op in self.ops:
            if op.type == "invoke":
                invokes.append(op)
            else:
                completions[op.op_id] = op
        return [OpPair(inv, completions.get(inv.op_id)) for inv in invokes]

    # --- persistence ---
    def to_jsonl(self) -> str:
        return "".join(json.dumps(op.to_json(), sort_keys=True, default=_encode) + "\n" for op in self.ops)

    def save(self, path: Path) -> None:
        path.write_text(self.to_jsonl())

    @classmethod
    def from_ops(cls, ops: Iterable[Op], *, ops_max: int = OPS_MAX) -> History:
        history = cls(ops_max=ops_max)
        for op in ops:
            invariant(len(history._ops) < ops_max, f"history is full ({ops_max} records)")
            history._ops.append(op)
            history._next_id = max(history._next_id, op.op_id + 1)
            if op.type == "invoke":
                history._open[op.op_id] = op
                history._busy[op.process] = op.op_id
            elif op.op_id in history._open:
                del history._busy[history._open.pop(op.op_id).process]
        return history

    @classmethod
    def merge(cls, histories: Iterable[History], *, ops_max: int = OPS_MAX) -> History:
        """One history from several recorded apart (say, one per client process on this machine,
        where the monotonic clock is shared): records in time order, op ids renumbered.
        Process names must not repeat across the inputs."""
        tagged: list[tuple[int, int, int, Op]] = []
        owner: dict[str, int] = {}
        for h_index, history in enumerate(histories):
            for op in history.ops:
                invariant(owner.setdefault(op.process, h_index) == h_index,
                          f"process {op.process} appears in two histories")
                tagged.append((op.time_ns, h_index, op.index, op))
        tagged.sort(key=lambda t: t[:3])
        ids: dict[tuple[int, int], int] = {}
        merged = []
        for index, (_t, h_index, _i, op) in enumerate(tagged):
            op_id = ids.setdefault((h_index, op.op_id), len(ids))
            merged.append(replace(op, op_id=op_id, index=index))
        return cls.from_ops(merged, ops_max=ops_max)

    @classmethod
    def from_jsonl(cls, text: str, *, ops_max: int = OPS_MAX) -> History:
        records = (json.loads(line, object_hook=_decode) for line in text.splitlines() if line.strip())
        return cls.from_ops((Op.from_json(r) for r in records), ops_max=ops_max)

    @classmethod
    def load(cls, path: Path, *, ops_max: int = OPS_MAX) -> History:
        return cls.from_jsonl(path.read_text(), ops_max=ops_max)


class Completion:
    """The handle :meth:`History.op` yields: complete it once with ok / fail / info."""

    def __init__(self, history: History, op_id: int) -> None:
        self.history = history
        self.op_id = op_id
        self.completed = False

    def ok(self, value: Any = None) -> None:
        self._mark()
        self.history.ok(self.op_id, value)

    def fail(self, error: str | BaseException | None = None) -> None:
        self._mark()
        self.history.fail(self.op_id, error)

    def info(self, error: str | BaseException | None = None) -> None:
        self._mark()
        self.history.info(self.op_id, error)

    def _mark(self) -> None:
        invariant(not self.completed, f"op {self.op_id} completed twice")
        self.completed = True


def _encode(value: Any) -> Any:
    """JSON for values json cannot carry: bytes as base64, sets as sorted lists."""
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"cannot record a {type(value).__name__} in a history")


def _decode(obj: dict[str, Any]) -> Any:
    if set(obj) == {"$bytes"}:
        return base64.b64decode(obj["$bytes"])
    return obj


def _error_text(error: str | BaseException | None) -> str | None:
    if error is None or isinstance(error, str):
        return error
    return f"{type(error).__name__}: {error}"


__all__ = [
    "DEFINITE_FAILURES",
    "INDETERMINATE",
    "Completion",
    "History",
    "Op",
    "OpPair",
    "OpType",
    "classify_error",
]
