"""The leader's fence probe for linearizable reads (``scriba.rsm.term``): the probe core
(``scriba.client.fence_probe``), the probe against in-process bookies, and a deposed
leader that does not know it is deposed — with the probe it serves no stale read; with
the check skipped (the negative control) it serves one, and the register checker says so."""

from __future__ import annotations

import asyncio
import time

import pytest
from rsm_machines import Register
from test_rsm_inprocess import FAST, Env, _fields, leader_of

from scriba.client import LedgerWriter
from scriba.client.fence_probe import UnfencedProbe, Verdict
from scriba.errors import ScribaError
from scriba.ids import BookieId
from scriba.quorum import Quorum, SlotRegions
from scriba.rsm import ReplicatedStateMachine, RsmConfig
from scriba.testing.checkers import Operation, check_register
from scriba.testing.waiting import eventually

E3W3A2 = Quorum(3, 3, 2)


# --- the core -----------------------------------------------------------------------------
def test_qa_not_fenced_answers_of_one_write_set_prove_it() -> None:
    probe = UnfencedProbe(E3W3A2)
    assert probe.on_answer(0, fenced=False) is Verdict.PENDING  # Qa - 1 answers prove nothing
    assert probe.on_answer(0, fenced=False) is Verdict.PENDING  # a slot counts once
    assert probe.on_answer(2, fenced=False) is Verdict.PROVEN


def test_a_fenced_answer_or_failures_that_leave_no_write_set_make_it_unproven() -> None:
    probe = UnfencedProbe(E3W3A2)
    assert probe.on_answer(1, fenced=True) is Verdict.PENDING  # slots 0 and 2 could still prove it
    assert probe.on_answer(0, fenced=False) is Verdict.PENDING
    assert probe.on_failure(2) is Verdict.UNPROVEN
    assert probe.fenced == 1 and probe.on_answer(2, fenced=False) is Verdict.UNPROVEN  # decided for good


def test_the_answers_must_fall_in_one_write_set() -> None:
    # E4/W2/A2: write sets {0,1} {1,2} {2,3} {3,0}; slots 0 and 2 share none
    probe = UnfencedProbe(Quorum(4, 2, 2))
    assert probe.on_answer(0, fenced=False) is Verdict.PENDING
    assert probe.on_answer(2, fenced=False) is Verdict.PENDING
    assert probe.on_answer(3, fenced=False) is Verdict.PROVEN  # {2,3} (and {3,0})


def test_with_regions_the_answers_must_span_them() -> None:
    regions = SlotRegions.of(["east", "east", "west"])
    probe = UnfencedProbe(Quorum(3, 3, 2, regions_min=2), regions)
    assert probe.on_answer(0, fenced=False) is Verdict.PENDING
    assert probe.on_answer(1, fenced=False) is Verdict.PENDING  # Qa slots, one region
    assert probe.on_answer(2, fenced=False) is Verdict.PROVEN


def test_a_timeout_leaves_it_unproven() -> None:
    probe = UnfencedProbe(E3W3A2)
    probe.on_answer(0, fenced=False)
    assert probe.on_timeout() is Verdict.UNPROVEN


# --- against in-process bookies ----------------------------------------------------------
async def test_leader_reads_are_proven_by_the_probe_without_appending(env: Env) -> None:
    r = await env.replica("r0")
    await leader_of([r])
    assert await r.propose(b"incr") == b"1"  # the ledger has an entry: its bookies know it
    term = r._term
    assert term is not None
    batches = term.batches_sent
    assert await asyncio.gather(*(r.read(b"get") for _ in range(50))) == [b"1"] * 50
    assert term.probes_proven >= 1 and term.probes_unproven == 0
    assert term.batches_sent == batches  # no barrier appended
    assert term.probes_proven <= 3  # the 50 reads shared rounds


async def test_barrier_mode_appends_a_barrier_and_probes_nothing(env: Env) -> None:
    r = await env.replica("r0", config=RsmConfig(**{**_fields(FAST), "leader_read_check": "barrier"}))
    await leader_of([r])
    await r.propose(b"incr")
    term = r._term
    assert term is not None
    batches = term.batches_sent
    assert await r.read(b"get") == b"1"
    assert term.batches_sent > batches and term.probes_proven == term.probes_unproven == 0


async def test_an_empty_ledger_proves_nothing_and_the_barrier_answers(env: Env) -> None:
    r = await env.replica("r0")
    await leader_of([r])
    term = r._term
    assert term is not None
    assert await r.read(b"get") == b"0"  # no entry yet: the bookies do not know the ledger
    assert term.probes_unproven >= 1 and term.batches_sent >= 1


# --- a deposed leader that does not know it -----------------------------------------------
@pytest.mark.parametrize("check", ["probe", "skipped"])
async def test_a_deposed_leader_serves_no_stale_read_unless_the_check_is_skipped(
    env: Env, monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """r0 leads, confirms ``set:1`` and serves a read (proven); it then stops noticing deposition (its role core
    ignores every reason) and gives up its election and stream lock, while one bookie of
    its ledger is down. r1 takes over — fencing r0's ledger on the two bookies it reaches,
    enough (``Qw - Qa + 1``) — and confirms ``set:2``; the bookie comes back, unfenced. A
    linearizable read sent to r0 after that: the probe finds only one "not fenced" answer
    (``Qa - 1``), proves nothing and the read fails. With the check skipped, r0 answers
    ``1`` from its state, and the checker reports the history non-linearizable."""
    config = RsmConfig(**{**_fields(FAST), "read_timeout_s": 3.0, "fence_probe_timeout_s": 1.0})
    r0 = await env.replica("r0", Register(), config)
    await leader_of([r0])
    r1 = await env.replica("r1", Register(), config)
    history: list[Operation] = []

    async def write(r: ReplicatedStateMachine, v: int) -> None:
        call = time.monotonic()
        await r.propose(b"set:%d" % v)
        history.append(Operation(r.replica_id, "write", v, None, call, time.monotonic()))

    await write(r0, 1)
    term = r0._term
    assert term is not None and r0.role.accepts(term.token)
    call = time.monotonic()
    assert await r0.read(b"get") == b"1"  # while it leads: proven by the probe
    history.append(Operation("reader", "read", None, 1, call, time.monotonic()))
    proven = term.probes_proven
    assert proven >= 1
    ledger = term.writer.current_ledger
    assert ledger is not None
    down = BookieId(ledger.metadata.current_ensemble[0])
    monkeypatch.setattr(r0.role, "deposed", lambda *args, **kwargs: [])  # r0 never learns it
    if check == "skipped":
        async def proven(self: LedgerWriter, timeout_s: float) -> bool:
            return True

        monkeypatch.setattr(LedgerWriter, "prove_unfenced", proven)
    env.transport.down.add(down)
    await r0._election.resign()
    await term.writer._election.resign()
    await eventually(lambda: r1.is_leader, 30, what="r1 leading")
    await write(r1, 2)
    env.transport.down.discard(down)
    assert r0.role.accepts(term.token)  # r0 still believes it leads

    call = time.monotonic()
    try:
        out = await r0.read(b"get")
    except ScribaError:
        out = None  # a failed read constrains nothing
    else:
        history.append(Operation("reader", "read", None, int(out) if out else None, call, time.monotonic()))
    result = check_register(history)
    if check == "probe":
        assert out is None, f"the deposed leader answered {out!r}"
        assert term.probes_unproven >= 1 and term.probes_proven == proven
        assert result.ok, result.explain()
    else:
        assert out == b"1"  # stale: set:2 was confirmed before the read was sent
        assert not result.ok  # the negative control: the checker catches it
