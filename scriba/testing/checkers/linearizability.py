"""Linearizability checker: a Wing-Gong search with Lowe's memoisation (as in Porcupine).

Inputs: operations with a call time, a return time, an argument and an output,
and a sequential model (:class:`RegisterModel`, or :class:`KVModel` which is a
register per key, checked per key). An operation that completed ``info``
(indeterminate) may or may not have taken effect: its return time is infinity
and its output unknown; indeterminate reads are dropped (they constrain nothing);
``fail`` operations are dropped (they did not happen).

The search walks the history's call/return events in time order, tries to
linearize a pending call at its current point (a model step), and backtracks
when a return is reached whose operation has not been linearized. It memoises
(linearized set, model state) so each configuration is explored once. Every
loop iteration is one step; a partition that exhausts ``steps_max`` gets the
verdict ``unknown``, which fails (``ok`` is False).

On failure the result carries, per failing partition, the longest partial
linearization found, the operation that could not be placed, and a minimal
counter-example: the failing sub-history left after greedily dropping every
read (and every never-observed write) whose removal keeps it non-linearizable —
removals that provably cannot turn a linearizable history into a bad one.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from scriba.invariant import invariant
from scriba.testing.checkers.acked_set import freeze
from scriba.testing.history import History

STEPS_MAX = 1_000_000
SHRINK_OPS_MAX = 20_000  # partitions larger than this are reported without shrinking
SHRINK_STEPS_TOTAL = 500_000  # search steps all shrinking attempts of a partition may spend
INFINITY = math.inf

Verdict = Literal["ok", "illegal", "unknown"]


class _Unknown:
    """The output of an operation whose outcome is unknown (it completed ``info``)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"


UNKNOWN: Any = _Unknown()

READ_NAMES = frozenset({"read", "r", "get"})
WRITE_NAMES = frozenset({"write", "w", "put"})
CAS_NAMES = frozenset({"cas"})


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation: ``f(arg) -> out`` by ``process``, between ``call`` and ``ret``."""

    process: str
    f: str
    arg: Any
    out: Any
    call: float
    ret: float = INFINITY
    op_id: int = -1

    @property
    def indeterminate(self) -> bool:
        return self.ret == INFINITY

    def describe(self, origin: float = 0.0, scale: float = 1.0, unit: str = "") -> str:
        ret = "inf" if self.indeterminate else f"{(self.ret - origin) / scale:.6g}{unit}"
        arg = "" if self.arg is None else repr(self.arg)
        return f"{self.process}: {self.f}({arg}) -> {self.out!r}   [{(self.call - origin) / scale:.6g}{unit}, {ret}]"


class Model(Protocol):
    """A sequential specification. States must be hashable."""

    @property
    def name(self) -> str: ...

    def init(self) -> Hashable: ...

    def step(self, state: Any, op: Operation) -> tuple[Hashable, ...]:
        """The states ``op`` may lead to from ``state``; empty if ``op`` is illegal there."""
        ...

    def partition(self, ops: Sequence[Operation]) -> list[tuple[str, list[Operation]]]:
        """Independent sub-histories (label, ops), each checked alone."""
        ...

    def is_read(self, op: Operation) -> bool:
        """True if ``op`` never changes the state (it can be dropped from a counter-example)."""
        ...


@dataclass(frozen=True, slots=True)
class RegisterModel:
    """A single register: read -> value, write(v), cas((old, new)) -> True/False."""

    initial: Any = None
    name: str = "register"

    def init(self) -> Hashable:
        return freeze(self.initial)

    def step(self, state: Any, op: Operation) -> tuple[Hashable, ...]:
        return _register_step(state, op)

    def partition(self, ops: Sequence[Operation]) -> list[tuple[str, list[Operation]]]:
        return [("register", list(ops))]

    def is_read(self, op: Operation) -> bool:
        return _register_is_read(op)


def _register_is_read(op: Operation) -> bool:
    """Reads, and a cas that answered "did not match": neither changes the state."""
    return op.f in READ_NAMES or (op.f in CAS_NAMES and op.out is False)


def _register_step(state: Any, op: Operation) -> tuple[Hashable, ...]:
    """Register semantics; values are frozen (hashable) already by the callers."""
    if op.f in READ_NAMES:
        return (state,) if op.out is UNKNOWN or freeze(op.out) == state else ()
    if op.f in WRITE_NAMES:
        return (freeze(op.arg),)
    if op.f in CAS_NAMES:
        old, new = freeze(op.arg)
        if op.out is UNKNOWN:
            return (new,) if state == old else (state,)
        if op.out in (True, None):  # succeeded
            return (new,) if state == old else ()
        return (state,) if state != old else ()  # answered "did not match"
    invariant(False, f"register model: unknown operation {op.f!r}")
    return ()


@dataclass(frozen=True, slots=True)
class KVModel:
    """A key-value map checked as one register per key.

    Arguments: ``read``/``get`` key -> value (None if absent); ``write``/``put``
    (key, value); ``cas`` (key, old, new) -> True/False.
    """

    initial: Any = None
    name: str = "kv"

    def init(self) -> Hashable:
        return freeze(self.initial)

    def step(self, state: Any, op: Operation) -> tuple[Hashable, ...]:
        return _register_step(state, op)

    def partition(self, ops: Sequence[Operation]) -> list[tuple[str, list[Operation]]]:
        by_key: dict[Any, list[Operation]] = {}
        for op in ops:
            key, register_op = self._split(op)
            by_key.setdefault(key, []).append(register_op)
        return [(f"key {key!r}", group) for key, group in sorted(by_key.items(), key=lambda kv: repr(kv[0]))]

    def is_read(self, op: Operation) -> bool:
        return _register_is_read(op)

    @staticmethod
    def _split(op: Operation) -> tuple[Any, Operation]:
        arg = freeze(op.arg)
        if op.f in READ_NAMES:
            key = arg[0] if isinstance(arg, tuple) else arg
            return key, replace(op, arg=None)
        if op.f in WRITE_NAMES:
            invariant(isinstance(arg, tuple) and len(arg) == 2, f"kv write needs (key, value): {op}")
            return arg[0], replace(op, arg=arg[1])
        if op.f in CAS_NAMES:
            invariant(isinstance(arg, tuple) and len(arg) == 3, f"kv cas needs (key, old, new): {op}")
            return arg[0], replace(op, arg=(arg[1], arg[2]))
        invariant(False, f"kv model: unknown operation {op.f!r}")
        return None, op


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionResult:
    label: str
    verdict: Verdict
    ops_count: int
    steps: int
    linearized: tuple[Operation, ...] = ()  # the longest partial linearization found
    stuck: Operation | None = None  # an operation that returned with no place in it
    counterexample: tuple[Operation, ...] = ()  # a minimal failing sub-history


@dataclass(frozen=True, slots=True)
class LinearizabilityResult:
    model: str
    verdict: Verdict
    partitions: tuple[PartitionResult, ...]
    steps_max: int
    time_scale: float = 1.0  # explain() divides times by this ...
    time_unit: str = ""  # ... and prints this unit (1e6, "ms" for a History's nanoseconds)

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def explain(self) -> str:
        ops = sum(p.ops_count for p in self.partitions)
        lines = [f"linearizability ({self.model}): {self.verdict.upper()} — {ops} operations, "
                 f"{len(self.partitions)} partitions"]
        for part in self.partitions:
            if part.verdict == "unknown":
                lines.append(f"  {part.label}: UNKNOWN — step budget of {self.steps_max} exhausted "
                             f"({part.ops_count} operations); this counts as a failure")
            elif part.verdict == "illegal":
                lines.extend(_explain_illegal(part, self.time_scale, self.time_unit))
        return "\n".join(lines)


def _explain_illegal(part: PartitionResult, scale: float, unit: str) -> list[str]:
    shown = [*part.counterexample, *part.linearized[-10:], *([part.stuck] if part.stuck else [])]
    finite = [t for op in shown for t in (op.call, op.ret) if t != INFINITY]
    origin = min(finite, default=0.0)
    lines = [f"  {part.label}: NOT LINEARIZABLE ({part.ops_count} operations, {part.steps} steps)"]
    if part.counterexample:
        lines.append(f"    minimal counter-example ({len(part.counterexample)} operations, by call time):")
        lines += [f"      {op.describe(origin, scale, unit)}" for op in sorted(part.counterexample, key=lambda o: o.call)]
    lines.append(f"    longest partial linearization ({len(part.linearized)} operations):")
    first = max(len(part.linearized) - 10, 0) + 1
    lines += [f"      {i}. {op.describe(origin, scale, unit)}" for i, op in enumerate(part.linearized[-10:], start=first)]
    if part.stuck is not None:
        lines.append(f"    then no order lets this operation return: {part.stuck.describe(origin, scale, unit)}")
    return lines


# --- search ----------------------------------------------------------------------------------


class _Node:
    """An event in the doubly linked list the search lifts operations out of.

    ``head`` and ``tail`` sentinels keep ``prev``/``next`` of every real node set.
    """

    __slots__ = ("index", "is_call", "match", "next", "op", "prev")

    def __init__(self, op: Any, index: int, is_call: bool) -> None:
        self.op: Any = op
        self.index = index
        self.is_call = is_call
        self.match: _Node = self
        self.prev: _Node = self
        self.next: _Node = self


def _build_list(ops: Sequence[Operation]) -> tuple[_Node, _Node]:
    events: list[tuple[float, int, int]] = []
    for i, op in enumerate(ops):
        invariant(op.call <= op.ret, f"operation returns before its call: {op}")
        events.append((op.call, 0, i))  # calls before returns at equal times: treated as concurrent
        events.append((op.ret, 1, i))
    events.sort()
    head, tail = _Node(None, -1, False), _Node(None, -2, False)
    calls: dict[int, _Node] = {}
    last = head
    for _time, kind, i in events:
        node = _Node(ops[i], i, kind == 0)
        if kind == 0:
            calls[i] = node
        else:
            calls[i].match = node
        last.next, node.prev = node, last
        last = node
    last.next, tail.prev = tail, last
    return head, tail


def _lift(call: _Node) -> None:
    ret = call.match
    call.prev.next = call.next
    call.next.prev = call.prev
    ret.prev.next = ret.next
    ret.next.prev = ret.prev


def _unlift(call: _Node) -> None:
    ret = call.match
    ret.prev.next = ret
    ret.next.prev = ret
    call.prev.next = call
    call.next.prev = call


def _search(ops: Sequence[Operation], model: Model, steps_max: int) -> PartitionResult:
    """One partition: the Wing-Gong/Lowe search. Verdict ok / illegal / unknown."""
    head, tail = _build_list(ops)
    state: Any = model.init()
    linearized = 0
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[_Node, Any, tuple[Any, ...]]] = []  # (call, state before, untried next states)
    best: tuple[Operation, ...] = ()
    stuck: Operation | None = None
    entry = head.next
    steps = 0
    while head.next is not tail:
        steps += 1
        if steps > steps_max:
            return PartitionResult("", "unknown", len(ops), steps - 1, best, stuck)
        if entry.is_call:
            bit = 1 << entry.index
            options = model.step(state, entry.op)
            chosen = _first_new(cache, linearized | bit, options)
            if chosen is None:
                entry = entry.next
                continue
            stack.append((entry, state, options[chosen + 1 :]))
            state, linearized = options[chosen], linearized | bit
            _lift(entry)
            entry = head.next
            continue
        # a return whose operation is not linearized yet: undo the latest choice
        if len(stack) > len(best) or stuck is None:
            best, stuck = tuple(n.op for n, _, _ in stack), entry.op
        if not stack:
            return PartitionResult("", "illegal", len(ops), steps, best, stuck)
        entry, state, linearized = _backtrack(stack, cache, linearized, head)
    return PartitionResult("", "ok", len(ops), steps)


def _first_new(cache: set[tuple[int, Any]], bits: int, options: Sequence[Any]) -> int | None:
    for k, option in enumerate(options):
        if (bits, option) not in cache:
            cache.add((bits, option))
            return k
    return None


def _backtrack(
    stack: list[tuple[_Node, Any, tuple[Any, ...]]], cache: set[tuple[int, Any]], linearized: int, head: _Node
) -> tuple[_Node, Any, int]:
    """Pop the latest linearized call; try its other possible next states, else move past it."""
    call, before, untried = stack.pop()
    _unlift(call)
    bit = 1 << call.index
    linearized &= ~bit
    chosen = _first_new(cache, linearized | bit, untried)
    if chosen is None:
        return call.next, before, linearized
    stack.append((call, before, untried[chosen + 1 :]))
    _lift(call)
    return head.next, untried[chosen], linearized | bit


# --- shrinking -------------------------------------------------------------------------------


def _removable(ops: Sequence[Operation], model: Model) -> list[int]:
    """Indices whose removal cannot make a linearizable history non-linearizable.

    Read-only operations (reads, and for registers a cas that answered "did not match")
    always. For registers also a write or a successful or indeterminate cas whose new
    value nobody observed (no read returned it, no cas expected it), provided no other
    failed or indeterminate cas remains: only those could notice the state it set.
    """
    result = [i for i, op in enumerate(ops) if model.is_read(op)]
    if not all(op.f in READ_NAMES | WRITE_NAMES | CAS_NAMES for op in ops):
        return result
    cas_ops = [op for op in ops if op.f in CAS_NAMES]
    noticing = [op for op in cas_ops if op.out is UNKNOWN or op.out is False]  # could see the state differ
    if len(noticing) > 1:
        return result
    observed = {freeze(op.out) for op in ops if op.f in READ_NAMES and op.out is not UNKNOWN}
    observed |= {freeze(op.arg)[0] for op in cas_ops}
    for i, op in enumerate(ops):
        if op.f in READ_NAMES or model.is_read(op) or (noticing and noticing[0] is not op):
            continue
        written = freeze(op.arg) if op.f in WRITE_NAMES else freeze(op.arg)[1]
        if written not in observed:
            result.append(i)
    return sorted(result)


def _shrink(ops: list[Operation], model: Model, steps_total: int) -> tuple[Operation, ...]:
    """Delta-debugging over removable ops: drop blocks that keep the history non-linearizable.

    Blocks start at half the candidates and halve when no block can go. Removing a set of
    removable ops is a chain of sound single removals (removability only grows as ops go),
    so the result is a real witness. All attempts together spend at most ``steps_total``
    search steps; running out leaves a smaller, not necessarily minimal, counter-example.
    """
    current = list(ops)
    budget = steps_total
    block = max(len(_removable(current, model)) // 2, 1)
    while budget > 0:
        candidates = _removable(current, model)
        if not candidates:
            break
        block = min(block, len(candidates))
        removed_any = False
        for start in reversed(range(0, len(candidates), block)):  # high indices first: lower stay valid
            gone = set(candidates[start : start + block])
            trial = [op for i, op in enumerate(current) if i not in gone]
            attempt = _search(trial, model, budget)
            budget -= attempt.steps
            if attempt.verdict == "illegal":
                current, removed_any = trial, True
            if budget <= 0:
                break
        if not removed_any:
            if block == 1:
                break
            block = max(block // 2, 1)
    return tuple(current)


def _prefix_at(ops: Sequence[Operation], t: float, model: Model) -> list[Operation]:
    """The history as of time ``t``: ops called by then; those still running become indeterminate.

    Sound for counter-examples: a linearization of the whole history, restricted to these
    ops, linearizes the prefix (ops called after ``t`` follow every op completed by ``t``,
    and the running ones may now do anything they could have done).
    """
    out = []
    for op in ops:
        if op.call > t:
            continue
        if op.ret > t:
            if model.is_read(op):
                continue  # an indeterminate read constrains nothing
            op = replace(op, ret=INFINITY, out=UNKNOWN)
        out.append(op)
    return out


def _counterexample(
    group: list[Operation], result: PartitionResult, model: Model, steps_max: int
) -> tuple[Operation, ...]:
    """A small failing sub-history: cut large histories at the stuck op's return, then shrink."""
    if len(group) > SHRINK_OPS_MAX and result.stuck is not None:
        prefix = _prefix_at(group, result.stuck.ret, model)
        if len(prefix) < len(group) and _search(prefix, model, steps_max).verdict == "illegal":
            group = prefix
    if len(group) > SHRINK_OPS_MAX:
        return ()
    return _shrink(group, model, SHRINK_STEPS_TOTAL)


# --- entry points ----------------------------------------------------------------------------


def check_linearizable(
    ops: Iterable[Operation],
    model: Model,
    *,
    steps_max: int = STEPS_MAX,
    shrink: bool = True,
    time_unit: tuple[float, str] = (1.0, ""),
) -> LinearizabilityResult:
    """Check ``ops`` against ``model``, partition by partition (each with ``steps_max`` steps)."""
    invariant(steps_max > 0, "steps_max must be positive")
    kept = [op for op in ops if not (op.indeterminate and model.is_read(op))]
    results = []
    for label, group in model.partition(kept):
        result = replace(_search(group, model, steps_max), label=label)
        if result.verdict == "illegal" and shrink:
            result = replace(result, counterexample=_counterexample(group, result, model, steps_max))
        results.append(result)
    verdicts = {r.verdict for r in results}
    verdict: Verdict = "illegal" if "illegal" in verdicts else "unknown" if "unknown" in verdicts else "ok"
    return LinearizabilityResult(model.name, verdict, tuple(results), steps_max, *time_unit)


def operations_from_history(history: History, *, fs: Iterable[str] | None = None) -> list[Operation]:
    """Operations for the checker: ``ok`` as recorded, ``info`` or never completed as
    indeterminate (return at infinity, output unknown), ``fail`` dropped."""
    wanted = set(fs) if fs is not None else None
    out = []
    for pair in history.pairs():
        inv = pair.invoke
        if (wanted is not None and inv.f not in wanted) or pair.status == "fail":
            continue
        if pair.status == "ok" and pair.completion is not None:
            ret: float = pair.completion.time_ns
            result = freeze(pair.completion.value)
        else:
            ret, result = INFINITY, UNKNOWN
        out.append(Operation(inv.process, inv.f, freeze(inv.value), result, inv.time_ns, ret, inv.op_id))
    return out


def check_register(
    source: History | Iterable[Operation], *, initial: Any = None, steps_max: int = STEPS_MAX
) -> LinearizabilityResult:
    ops, unit = _operations(source)
    return check_linearizable(ops, RegisterModel(initial), steps_max=steps_max, time_unit=unit)


def check_kv(
    source: History | Iterable[Operation], *, initial: Any = None, steps_max: int = STEPS_MAX
) -> LinearizabilityResult:
    ops, unit = _operations(source)
    return check_linearizable(ops, KVModel(initial), steps_max=steps_max, time_unit=unit)


def _operations(source: History | Iterable[Operation]) -> tuple[list[Operation], tuple[float, str]]:
    if isinstance(source, History):
        return operations_from_history(source), (1e6, "ms")  # monotonic nanoseconds
    return list(source), (1.0, "")
