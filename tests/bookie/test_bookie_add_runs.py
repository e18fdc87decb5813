"""Adds sent as packed runs (``AddBatch.runs``): the clients' hot path, in-process."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from test_bookie_service import DIGEST, KEY, SlowStorage, entry, make_bookie  # noqa: F401  (the fixture)

from scriba.entry import pack_entry
from scriba.errors import Status
from scriba.proto import scriba_pb2 as pb


def run(lid: int, eids: Sequence[int], *, key: bytes = KEY, recovery: bool = False,
        datas: Sequence[bytes] | None = None, sizes: Sequence[int] | None = None) -> pb.AddRun:
    datas = [entry(lid, e) for e in eids] if datas is None else datas
    return pb.AddRun(
        ledger_id=lid, master_key=key, flags=pb.RECOVERY_ADD if recovery else 0, entry_ids=list(eids),
        sizes=[len(d) for d in datas] if sizes is None else list(sizes), entries=b"".join(datas),
    )


async def send(stub: object, batches: Sequence[pb.AddBatch]) -> dict[tuple[int, int], tuple[int, str]]:
    """Every answer as {(ledger, entry): (status, message)}; asserts no add is answered twice."""
    call = stub.AddStream(iter(batches))  # type: ignore[attr-defined]
    out: dict[tuple[int, int], tuple[int, str]] = {}
    async for resp in call:
        for r in resp.responses:
            assert (r.ledger_id, r.entry_id) not in out
            out[(r.ledger_id, r.entry_id)] = (r.status, r.message)
        for a in resp.runs:
            for eid in a.entry_ids:
                assert (a.ledger_id, eid) not in out
                out[(a.ledger_id, eid)] = (a.status, a.message)
    return out


async def read(stub: object, lid: int, eid: int) -> pb.ReadEntryResponse:
    return await stub.ReadEntry(pb.ReadEntryRequest(master_key=KEY, ledger_id=lid, entry_id=eid))  # type: ignore[attr-defined,no-any-return]


async def test_runs_are_stored_answered_in_runs_and_read_back(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    batches = [pb.AddBatch(runs=[run(1, range(0, 64)), run(2, range(0, 10))]),
               pb.AddBatch(runs=[run(1, range(64, 100))])]
    answers = await send(bk.stub, batches)
    assert set(answers) == {(1, e) for e in range(100)} | {(2, e) for e in range(10)}
    assert {st for st, _ in answers.values()} == {Status.OK}
    for lid, eid in [(1, 0), (1, 63), (1, 99), (2, 9)]:
        got = await read(bk.stub, lid, eid)
        assert got.status == Status.OK and got.entry == entry(lid, eid)
    lac = await bk.stub.ReadLac(pb.ReadLacRequest(master_key=KEY, ledger_id=1))
    assert lac.status == Status.OK and lac.lac == 98


async def test_a_message_with_runs_and_single_adds_answers_both(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    single = pb.AddRequest(ledger_id=5, entry_id=0, master_key=KEY, entry=entry(5, 0))
    answers = await send(bk.stub, [pb.AddBatch(adds=[single], runs=[run(6, [0, 1, 2])])])
    assert answers == {(5, 0): (Status.OK, ""), **{(6, e): (Status.OK, "") for e in range(3)}}


async def test_malformed_runs_are_refused_whole_and_the_bookie_keeps_serving(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    datas = [entry(3, e) for e in range(4)]
    bad = [
        run(3, range(4), sizes=[len(d) for d in datas][:3]),  # fewer sizes than ids
        run(3, range(4), sizes=[len(datas[0]) + 1] + [len(d) for d in datas[1:]]),  # sizes over the bytes
        run(3, range(4), key=b""),  # no master key
        pb.AddRun(ledger_id=3, master_key=KEY, entry_ids=[-2], sizes=[len(datas[0])], entries=datas[0]),
    ]
    for r in bad:
        answers = await send(bk.stub, [pb.AddBatch(runs=[r])])
        assert answers and {st for st, _ in answers.values()} == {Status.BAD_REQUEST}, r
        assert all(msg for _, msg in answers.values())
    assert (await read(bk.stub, 3, 0)).status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY)
    good = await send(bk.stub, [pb.AddBatch(runs=[run(3, range(4))])])
    assert {st for st, _ in good.values()} == {Status.OK} and len(good) == 4


async def test_a_bad_entry_inside_a_run_fails_alone(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    datas = [entry(4, 0), entry(4, 99), entry(4, 2), b"short"]  # entry 1 names id 99; entry 3 too short
    answers = await send(bk.stub, [pb.AddBatch(runs=[run(4, range(4), datas=datas)])])
    assert answers[(4, 0)][0] == Status.OK and answers[(4, 2)][0] == Status.OK
    assert answers[(4, 1)][0] == Status.BAD_REQUEST and answers[(4, 3)][0] == Status.BAD_REQUEST
    assert (await read(bk.stub, 4, 2)).entry == entry(4, 2)
    assert (await read(bk.stub, 4, 1)).status == Status.NO_SUCH_ENTRY


async def test_runs_meet_master_key_and_fencing_like_single_adds(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie()
    assert {st for st, _ in (await send(bk.stub, [pb.AddBatch(runs=[run(7, range(3))])])).values()} == {Status.OK}
    wrong = await send(bk.stub, [pb.AddBatch(runs=[run(7, range(3, 6), key=b"k" * 32)])])
    assert {st for st, _ in wrong.values()} == {Status.UNAUTHORIZED}
    fenced = await bk.stub.ReadLac(pb.ReadLacRequest(ledger_id=7, flags=pb.FENCE, master_key=KEY))
    assert fenced.status == Status.OK
    normal = await send(bk.stub, [pb.AddBatch(runs=[run(7, range(3, 6))])])
    assert {st for st, _ in normal.values()} == {Status.FENCED}
    recovery = await send(bk.stub, [pb.AddBatch(runs=[run(7, range(3, 6), recovery=True)])])
    assert {st for st, _ in recovery.values()} == {Status.OK}
    assert (await read(bk.stub, 7, 5)).entry == entry(7, 5)


async def test_a_message_over_the_batch_limit_is_refused(make_bookie) -> None:  # noqa: F811
    bk = await make_bookie(batch_entries_max=8)
    answers = await send(bk.stub, [pb.AddBatch(runs=[run(8, range(5)), run(9, range(5))])])
    assert len(answers) == 10 and {st for st, _ in answers.values()} == {Status.BAD_REQUEST}
    ok = await send(bk.stub, [pb.AddBatch(runs=[run(8, range(8))])])
    assert {st for st, _ in ok.values()} == {Status.OK}


async def test_runs_beyond_the_in_flight_bound_get_too_many_requests(make_bookie) -> None:  # noqa: F811
    storage = SlowStorage()
    bk = await make_bookie(storage=storage, inflight_bytes_per_connection_max=5 * 1024 * 1024,
                           entry_size_max=1024 * 1024)
    payload = b"z" * (1024 * 1024 - 100)
    queue: asyncio.Queue[pb.AddBatch | None] = asyncio.Queue()

    async def requests():  # type: ignore[no-untyped-def]
        while (item := await queue.get()) is not None:
            yield item

    call = bk.stub.AddStream(requests())
    for i in range(8):
        queue.put_nowait(pb.AddBatch(runs=[run(13, [i], datas=[pack_entry(DIGEST, 13, i, -1, 0, payload)])]))
    first = await asyncio.wait_for(call.read(), 10)
    # refused runs are answered at once, the accepted ones wait for storage
    assert first.runs[0].status == Status.TOO_MANY_REQUESTS and first.runs[0].message
    storage.gate.set()
    queue.put_nowait(None)
    statuses = [a.status for a in first.runs for _ in a.entry_ids]
    while (resp := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
        statuses.extend(a.status for a in resp.runs for _ in a.entry_ids)
    ok, refused = statuses.count(Status.OK), statuses.count(Status.TOO_MANY_REQUESTS)
    assert ok + refused == 8 and 4 <= ok < 8 and refused >= 1
    assert storage.batches == ok  # a refused run never reaches storage
