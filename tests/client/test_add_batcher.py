"""``BookieAdds``: one bookie's add batching without I/O (runs, messages, answers, expiry).

The gRPC transport's own tests (``test_transport_fake.py``, ``test_transport_runs.py``)
drive it through a fake bookie; these drive it directly, with a hand-turned clock.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba.client.add_batcher import (
    QUEUED,
    REFUSED,
    STOPPED,
    WAKE,
    AddBatcher,
    AddRun,
    BookieAdds,
    encode_run,
)
from scriba.client.transport import TransportConfig
from scriba.config import ConfigError
from scriba.proto import scriba_pb2 as pb

KEY = b"k" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cb_a(*args: Any) -> None:
    pass


def cb_b(*args: Any) -> None:
    pass


def key(ledger_id: int = 7, callback: Any = cb_a, flags: int = 0, per_entry: bool = False) -> tuple[Any, ...]:
    return (callback, ledger_id, flags, KEY, per_entry)


class One:
    """One started bookie ``b1`` of an ``AddBatcher``: ``push`` returns its code."""

    def __init__(self, clock: Clock | None = None, **cfg: Any) -> None:
        config = TransportConfig(**{"batch_entries_max": 4, "batches_inflight_max": 2, "add_timeout_s": 10.0, **cfg})
        self.batcher = AddBatcher(config, clock or Clock())
        self.batcher.start("b1")
        self.adds = self.batcher.bookie("b1")

    def push(self, key: tuple[Any, ...], entry_id: int, entry: bytes) -> int:
        attention = self.batcher.push(("b1",), key, entry_id, entry)  # type: ignore[arg-type]
        if attention is None:
            return QUEUED
        ((bookie_id, code),) = attention
        assert bookie_id == "b1" and code != QUEUED
        return code

    def __getattr__(self, name: str) -> Any:  # the BookieAdds views and steps
        return getattr(self.adds, name)


def batcher(clock: Clock | None = None, **cfg: Any) -> Any:
    return One(clock, **cfg)


def message(adds: Any) -> pb.AddBatch:
    parts: list[bytes] = []
    assert adds.take_message(parts) > 0
    return pb.AddBatch.FromString(b"".join(parts))


def test_config_validate_names_the_field() -> None:
    for bad, field in (
        ({"add_timeout_s": 0}, "add_timeout_s"),
        ({"batch_entries_max": 0}, "batch_entries_max"),
        ({"batch_bytes_max": 0}, "batch_bytes_max"),
        ({"batches_inflight_max": 0}, "batches_inflight_max"),
        ({"inflight_bytes_max": 10, "inflight_bytes_hard_max": 9}, "inflight_bytes_hard_max"),
        ({"sweep_interval_s": 0.0}, "sweep_interval_s"),
    ):
        with pytest.raises(ConfigError, match=field):
            TransportConfig(**bad).validate()  # type: ignore[arg-type]
    config = TransportConfig(inflight_bytes_max=10, add_timeout_s=0.01)
    assert config.resolved_inflight_bytes_hard_max == 40
    assert config.resolved_sweep_interval_s == 0.005  # add_timeout_s / 10, at least 5 ms
    assert TransportConfig().resolved_sweep_interval_s == 0.1  # at most 100 ms
    assert TransportConfig(batch_entries_max=3, batches_inflight_max=5).send_window_entries == 15


def test_adds_with_one_key_share_a_run_until_it_is_full() -> None:
    adds = batcher()
    assert adds.push(key(), 0, b"a") == WAKE  # the first queued add wakes the sender
    assert adds.push(key(), 1, b"b") == QUEUED
    assert adds.push(key(callback=cb_b), 2, b"c") == QUEUED  # another callback: a new run
    assert adds.push(key(), 3, b"d") == WAKE  # a full batch's worth is queued; joins its key's open run
    assert adds.push(key(flags=pb.RECOVERY_ADD), 4, b"e") == QUEUED
    assert [(r.entry_ids, r.callback, r.flags) for r in adds.queue] == [
        ([0, 1, 3], cb_a, 0), ([2], cb_b, 0), ([4], cb_a, pb.RECOVERY_ADD)
    ]
    assert adds.queued_entries == 5 and adds.inflight_bytes == 5 and adds.pending() == 5


def test_interleaved_ledgers_share_one_run_each_per_message() -> None:
    """Adds of many ledgers arriving interleaved (streams, RSM groups) travel as one run
    per ledger, not one run per add; a sent run takes no more adds."""
    adds = batcher(batch_entries_max=16)
    for entry_id in range(3):
        for ledger in (1, 2, 3):
            adds.push(key(ledger_id=ledger), entry_id, b"x")
    assert [(r.ledger_id, r.entry_ids) for r in adds.queue] == [(1, [0, 1, 2]), (2, [0, 1, 2]), (3, [0, 1, 2])]
    parts: list[bytes] = []
    assert adds.take_message(parts) == 9 and not adds.queue and not adds.open_runs
    adds.push(key(ledger_id=1), 3, b"y")
    assert [(r.ledger_id, r.entry_ids) for r in adds.queue] == [(1, [3])]  # a new run: the old one was sent


def test_a_run_closes_at_batch_limits() -> None:
    adds = batcher(batch_entries_max=3, batch_bytes_max=10)
    for entry_id in range(4):
        adds.push(key(), entry_id, b"x")
    adds.push(key(), 4, b"y" * 12)  # over batch_bytes_max: alone in its run
    adds.push(key(), 5, b"z")
    assert [r.entry_ids for r in adds.queue] == [[0, 1, 2], [3, 4], [5]]


def test_hard_bound_refuses_unless_nothing_is_in_flight() -> None:
    adds = batcher(inflight_bytes_max=10, inflight_bytes_hard_max=20)
    assert adds.push(key(), 0, b"x" * 50) == WAKE  # nothing in flight: one big entry goes
    assert adds.push(key(), 1, b"y") == REFUSED
    assert adds.pending() == 1 and adds.inflight_bytes == 50
    message(adds)
    _, finished = adds.answer(7, [0])
    assert finished and adds.inflight_bytes == 0
    assert adds.push(key(), 1, b"y" * 20) != REFUSED
    assert adds.push(key(), 2, b"z") == REFUSED  # 20 + 1 > 20


def test_send_rule_holds_partial_messages_while_the_window_is_full() -> None:
    adds = batcher(batch_entries_max=2, batches_inflight_max=2)  # window: 4 adds
    assert not adds.ready()
    for entry_id in range(4):
        adds.push(key(), entry_id, b"x")
    assert adds.ready()
    assert len(message(adds).runs[0].entry_ids) == 2  # at most batch_entries_max per message
    assert len(message(adds).runs[0].entry_ids) == 2
    assert adds.sent_unanswered == 4 and not adds.ready()
    adds.push(key(), 4, b"x")
    assert not adds.ready()  # partial and the window is used up: held back
    adds.push(key(), 5, b"x")
    assert adds.ready()  # a full message always goes
    message(adds)
    adds.push(key(), 6, b"x")
    assert not adds.ready() and not adds.wants_more()
    adds.answer(7, [0, 1])
    assert adds.sent_unanswered == 4 and not adds.wants_more()
    adds.answer(7, [2])
    assert adds.wants_more() and adds.ready()  # the answers opened the window


def test_a_message_takes_whole_runs_and_parses_as_addbatch() -> None:
    adds = batcher(batch_entries_max=6, batch_bytes_max=10_000)
    for entry_id in range(3):
        adds.push(key(7), entry_id, bytes([entry_id]) * 100)
    adds.push(key(8, flags=pb.RECOVERY_ADD), 0, b"")
    adds.push(key(7), 3, b"late" * 10)  # joins ledger 7's open run
    adds.push(key(7), 4, b"x")
    adds.push(key(9), 0, b"y")
    adds.push(key(9), 1, b"z")
    batch = message(adds)
    assert [(r.ledger_id, list(r.entry_ids), list(r.sizes), r.flags) for r in batch.runs] == [
        (7, [0, 1, 2, 3, 4], [100, 100, 100, 40, 1], 0), (8, [0], [0], pb.RECOVERY_ADD),
    ]  # the third run would pass batch_entries_max: it waits for the next message
    assert batch.runs[0].entries == b"".join(bytes([i]) * 100 for i in range(3)) + b"late" * 10 + b"x"
    assert all(r.master_key == KEY for r in batch.runs)
    assert adds.queued_entries == 2 and adds.sent_unanswered == 6
    (run,) = adds.queue
    assert (run.ledger_id, run.entry_ids) == (9, [0, 1])


def test_encoded_runs_equal_the_protobuf_encoding() -> None:
    runs = []
    for lid, flags, count, size in ((7, 0, 3, 150), (8, pb.RECOVERY_ADD, 1, 0), (7, 0, 200, 1000)):
        run = AddRun((None, lid, flags, KEY, False), 0.0)
        for e in range(count):
            entry = bytes([e % 251]) * (size + e)
            run.entry_ids.append(e + (1 << 40))
            run.entries.append(entry)
            run.size += len(entry)
        runs.append(run)
    parts: list[bytes] = []
    for run in runs:
        encode_run(run, parts)
    expected = pb.AddBatch()
    for run in runs:
        expected.runs.add(
            ledger_id=run.ledger_id, master_key=KEY, flags=run.flags, entry_ids=run.entry_ids,
            sizes=[len(x) for x in run.entries], entries=b"".join(run.entries),
        )
    assert b"".join(parts) == expected.SerializeToString()


def test_answers_are_grouped_by_the_run_that_sent_them() -> None:
    adds = batcher(batch_entries_max=8)
    for entry_id in range(3):
        adds.push(key(callback=cb_a), entry_id, b"aa")
    for entry_id in range(3, 5):
        adds.push(key(callback=cb_b), entry_id, b"b")
    message(adds)
    assert adds.inflight_bytes == 8
    groups, finished = adds.answer(7, [1, 3, 99])  # 99: never sent, dropped
    assert [(r.callback, ids) for r, ids in groups] == [(cb_a, [1]), (cb_b, [3])]
    assert not finished and adds.inflight_bytes == 8
    groups, finished = adds.answer(7, [4])
    assert [(r.callback, ids) for r, ids in groups] == [(cb_b, [4])]
    assert finished and adds.inflight_bytes == 6  # cb_b's run is complete: its bytes go
    for ledger_id, ids in ((7, [4]), (9, [0])):  # answered already; nothing pending
        groups, finished = adds.answer(ledger_id, ids)
        assert list(groups) == [] and not finished
    groups, finished = adds.answer(7, [0, 2])
    assert [ids for _, ids in groups] == [[0, 2]] and finished
    assert adds.inflight_bytes == 0 and adds.pending() == 0 and not adds.runs


def test_an_add_sent_again_while_pending_is_answered_in_order() -> None:
    adds = batcher(batch_entries_max=8)
    adds.push(key(callback=cb_a), 5, b"x")
    message(adds)
    adds.push(key(callback=cb_b), 5, b"x")  # the same add again (a re-send)
    adds.push(key(callback=cb_b), 6, b"y")
    message(adds)
    assert adds.pending() == 3
    groups, _ = adds.answer(7, [5])
    assert [(r.callback, ids) for r, ids in groups] == [(cb_a, [5])]  # the oldest first
    groups, _ = adds.answer(7, [5, 6])
    assert [(r.callback, ids) for r, ids in groups] == [(cb_b, [5, 6])]
    assert adds.pending() == 0 and not adds.dups


def test_expiry_lists_runs_past_their_deadline_oldest_first() -> None:
    clock = Clock()
    adds = batcher(clock, add_timeout_s=5.0)
    adds.push(key(callback=cb_a), 0, b"x")
    clock.now += 2
    adds.push(key(callback=cb_b), 1, b"x")
    first, second = adds.queue
    assert (first.deadline, second.deadline) == (105.0, 107.0)
    assert adds.expired(104.9) == []
    assert adds.expired(105.0) == [first]
    assert adds.expired(200.0) == [first, second]


def test_drain_returns_each_unanswered_add_once_and_resets() -> None:
    adds = batcher(batch_entries_max=3)
    for entry_id in range(3):
        adds.push(key(callback=cb_a), entry_id, b"x")
    message(adds)
    adds.answer(7, [1])
    adds.push(key(callback=cb_b), 0, b"x")  # sent again while pending
    message(adds)
    adds.push(key(callback=cb_b), 3, b"x")  # queued, never sent
    drained = {(r.callback, tuple(sorted(ids))) for r, ids in adds.drain()}
    assert drained == {(cb_a, (0, 2)), (cb_b, (0,)), (cb_b, (3,))}
    assert adds.pending() == 0 and adds.inflight_bytes == 0 and adds.sent_unanswered == 0
    assert not adds.runs and not adds.queue and not adds.open_runs
    assert adds.drain() == []


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 1), st.integers(0, 12), st.integers(0, 40)),
        st.tuples(st.just("send"), st.just(0), st.just(0), st.just(0)),
        st.tuples(st.just("answer"), st.integers(0, 1), st.integers(0, 12), st.integers(1, 4)),
        st.tuples(st.just("drain"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_every_push_comes_back_exactly_once(script: list[tuple[str, int, int, int]]) -> None:
    """Whatever the order of pushes, messages, answers and drains: every queued add is
    returned once (by ``answer`` or ``drain``), and ``inflight_bytes`` is the bytes of
    the runs not yet complete."""
    adds = batcher(batch_entries_max=3, batches_inflight_max=1, inflight_bytes_max=60)
    pushed: Counter[tuple[int, int]] = Counter()
    returned: Counter[tuple[int, int]] = Counter()
    for op, ledger, entry, n in script:
        if op == "push":
            if adds.push(key(ledger), entry, b"p" * n) != REFUSED:
                pushed[(ledger, entry)] += 1
        elif op == "send" and adds.queued_entries:
            adds.take_message([])
        elif op == "answer":
            groups, _ = adds.answer(ledger, list(range(entry, entry + n)))
            for run, ids in groups:
                returned.update((run.ledger_id, e) for e in ids)
        elif op == "drain":
            for run, ids in adds.drain():
                returned.update((run.ledger_id, e) for e in ids)
        assert adds.inflight_bytes == sum(r.size for r in adds.runs)
        assert adds.pending() == sum(pushed.values()) - sum(returned.values())
    for run, ids in adds.drain():
        returned.update((run.ledger_id, e) for e in ids)
    assert returned == pushed


def test_push_names_only_the_bookies_that_need_the_transport() -> None:
    batcher = AddBatcher(TransportConfig(batch_entries_max=4), Clock())
    for bookie_id in ("b1", "b2", "b3"):
        batcher.start(bookie_id)
    write_set = ("b1", "b2", "b3")
    assert batcher.push(write_set, key(), 0, b"x") == [("b1", WAKE), ("b2", WAKE), ("b3", WAKE)]
    assert batcher.push(write_set, key(), 1, b"x") is None  # queued everywhere: nothing to do
    batcher.stop("b2")  # its stream failed
    assert batcher.push(write_set, key(), 2, b"x") == [("b2", STOPPED)]
    assert batcher.bookie("b2").queued_entries == 2  # nothing queued while stopped
    assert batcher.push(("b4",), key(), 0, b"x") == [("b4", STOPPED)]  # never started
    batcher.start("b2")
    assert batcher.push(("b2",), key(), 2, b"x") is None
    assert [batcher.bookie(b).queued_entries for b in write_set] == [3, 3, 3]
    assert isinstance(batcher.bookie("b1"), BookieAdds) and batcher.bookie("b4").pending() == 0
