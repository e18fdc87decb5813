"""Batched linearizable reads: read-index rounds shared only by reads that arrived before
they started, the ``READ_MANY`` frame codec, and ``RsmClient`` pipelining many reads per
frame against in-process replicas (leader and followers)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_rsm_inprocess import Env, leader_of

from scriba.errors import (
    BadConsistencyError,
    BadRequestError,
    ConfigError,
    RsmNotLeaderError,
    UnavailableError,
)
from scriba.rsm import wire
from scriba.rsm.read_index import ReadIndexRounds
from scriba.rsm.remote import RsmClient
from scriba.stream import Position
from scriba.testing.waiting import eventually


# --- read-index rounds --------------------------------------------------------------------
class Leader:
    """A stand-in confirmation: each round blocks until released, answers the next index."""

    def __init__(self) -> None:
        self.started: list[asyncio.Event] = []
        self.release: list[asyncio.Event] = []
        self.fail: Exception | None = None

    async def confirm(self) -> Position | None:
        n = len(self.started)
        self.started.append(asyncio.Event())
        self.release.append(asyncio.Event())
        self.started[n].set()
        await self.release[n].wait()
        if self.fail is not None:
            raise self.fail
        return Position(0, n + 1, 0)


async def test_reads_share_a_round_only_if_they_arrived_before_it_started() -> None:
    leader = Leader()
    rounds = ReadIndexRounds(leader.confirm)
    first = [asyncio.create_task(rounds.read_index()) for _ in range(5)]
    await eventually(lambda: len(leader.started) == 1)
    late = [asyncio.create_task(rounds.read_index()) for _ in range(7)]  # arrive while round 1 runs
    await asyncio.sleep(0)
    assert len(leader.started) == 1 and rounds.rounds == 1  # no second round while one runs
    leader.release[0].set()
    assert await asyncio.gather(*first) == [Position(0, 1, 0)] * 5
    await eventually(lambda: len(leader.started) == 2)
    assert not any(t.done() for t in late)  # round 1 began before they arrived: it proves nothing for them
    leader.release[1].set()
    assert await asyncio.gather(*late) == [Position(0, 2, 0)] * 7
    assert rounds.rounds == 2
    await rounds.close()


async def test_a_failed_round_fails_its_group_and_the_next_group_gets_a_new_round() -> None:
    leader = Leader()
    rounds = ReadIndexRounds(leader.confirm)
    group = [asyncio.create_task(rounds.read_index()) for _ in range(3)]
    await eventually(lambda: len(leader.started) == 1)
    leader.fail = RsmNotLeaderError("deposed")
    leader.release[0].set()
    for task in group:
        with pytest.raises(RsmNotLeaderError):
            await task
    leader.fail = None
    nxt = asyncio.create_task(rounds.read_index())
    await eventually(lambda: len(leader.started) == 2)
    leader.release[1].set()
    assert await nxt == Position(0, 2, 0)
    stuck = asyncio.create_task(rounds.read_index())
    await eventually(lambda: len(leader.started) == 3)
    await rounds.close()  # the replica stops: the running round's readers do not hang
    with pytest.raises(Exception, match="cancelled"):
        await stuck


# --- the READ_MANY codec ------------------------------------------------------------------
def test_read_many_frames_round_trip() -> None:
    reads = [wire.read_body("linearizable", None, b"get"), wire.read_body("after", Position(3, 4, 5), b"x" * 300),
             wire.read_body("sequential", None, b"")]
    parsed = wire.parse_read_many(wire.read_many_body(reads))
    assert parsed == [("linearizable", None, b"get"), ("after", Position(3, 4, 5), b"x" * 300),
                      ("sequential", None, b"")]
    answers = [(True, b"1"), (False, wire.error_body(BadConsistencyError("no"))), (True, b"")]
    back = wire.parse_read_many_answer(wire.read_many_answer(answers), 3)
    assert back == answers
    assert isinstance(wire.error_from(back[1][1]), BadConsistencyError)


@pytest.mark.parametrize("body", [b"", b"\x00\x00", b"\x00\x00\x00\x02\x00\x00\x00\x01\x00",
                                  b"\x00\x00\x00\x01\x00\x00\x00\x09\x00\x00",
                                  b"\x00\x00\x00\x00trailing", b"\xff\xff\xff\xff"])
def test_malformed_read_many_frames_are_bad_requests(body: bytes) -> None:
    with pytest.raises(BadRequestError):
        wire.parse_read_many(body)


def test_a_read_many_answer_with_the_wrong_count_is_refused() -> None:
    with pytest.raises(BadRequestError, match="2 results for 3 reads"):
        wire.parse_read_many_answer(wire.read_many_answer([(True, b"a"), (True, b"b")]), 3)


def test_reads_per_frame_bounds_are_checked() -> None:
    with pytest.raises(ConfigError):
        RsmClient(["127.0.0.1:1"], reads_per_frame_max=0)
    with pytest.raises(ConfigError):
        RsmClient(["127.0.0.1:1"], reads_per_frame_max=wire.READS_PER_FRAME_MAX + 1)


# --- pipelined reads against replicas -----------------------------------------------------
async def test_pipelined_reads_share_frames_and_confirmations_and_see_every_write(env: Env) -> None:
    replicas = [await env.replica(f"r{i}") for i in range(3)]
    leader = await leader_of(replicas)
    followers = [r for r in replicas if r is not leader]
    await eventually(lambda: all(f.leader is not None and f.leader[0] == leader.replica_id for f in followers))
    client = RsmClient([r.address for r in replicas], timeout_s=30)
    try:
        session = await client.open_session()
        for i in range(1, 21):
            assert await client.propose(b"incr", session=session) == str(i).encode()
            # right after each write returned: every replica's linearizable read sees it (a
            # follower's tail lags the leader by at least the last entry until the next LAC)
            for r in [*followers, leader]:
                got = await asyncio.gather(*(client.read(b"get", address=r.address) for _ in range(3)))
                assert got == [str(i).encode()] * 3, f"{r.replica_id} after write {i}: {got}"
        frames = client.read_frames_sent
        barriers = leader._term.batches_sent if leader._term else 0
        many = await asyncio.gather(*(client.read(b"get") for _ in range(2000)))
        assert many == [b"20"] * 2000
        assert client.read_frames_sent - frames <= 4  # 2000 reads in 1024-read frames, not one frame each
        assert leader._term is not None and leader._term.batches_sent - barriers <= 4  # few barrier appends
        rounds = followers[0]._follower_rounds.rounds
        on_follower = await asyncio.gather(*(client.read(b"get", address=followers[0].address) for _ in range(500)))
        assert on_follower == [b"20"] * 500
        assert followers[0]._follower_rounds.rounds - rounds <= 2  # one READ_INDEX round trip for the frame
    finally:
        await client.close()


async def test_one_frame_answers_each_read_on_its_own(env: Env) -> None:
    r = await env.replica("r0")
    await leader_of([r])
    client = RsmClient([r.address], timeout_s=30)
    try:
        committed = await client.submit(b"incr")
        results = await asyncio.gather(
            client.read(b"get"), client.read(b"get", "sequential"), client.read(b"get", "after", after=committed.position),
            client.read(b"get", "after"),  # no position: this read fails, the frame's others do not
            return_exceptions=True)
        assert results[:3] == [b"1", b"1", b"1"]
        assert isinstance(results[3], BadConsistencyError)
        with pytest.raises(BadConsistencyError):
            await client.read(b"get", "eventual")
    finally:
        await client.close()


async def test_reads_in_flight_when_the_client_closes_do_not_hang(env: Env) -> None:
    r = await env.replica("r0")
    await leader_of([r])
    client = RsmClient(["127.0.0.1:1"], timeout_s=5, attempt_timeout_s=0.5)  # nobody listens there
    reads = [asyncio.create_task(client.read(b"get")) for _ in range(10)]
    await eventually(lambda: client.read_frames_sent == 1)
    await client.close()
    for task in reads:
        with pytest.raises(UnavailableError):
            await task


async def test_a_frame_of_linearizable_reads_confirms_leadership_first(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READ_MANY with a linearizable read asks for a read index (the leadership proof)
    before answering; a replica that cannot prove it fails the whole frame, answering
    nothing from its possibly stale state. Sequential-only frames need no proof."""
    r = await env.replica("r0")
    await leader_of([r])
    read = wire.read_body("linearizable", None, b"get")
    asked: list[bool] = []

    async def deposed(*, forwarded: bool) -> Any:
        asked.append(forwarded)
        raise RsmNotLeaderError("deposed meanwhile")

    monkeypatch.setattr(r, "read_index", deposed)
    with pytest.raises(RsmNotLeaderError):
        await r.read_many([wire.parse_read(read)])
    assert asked == [False]
    assert await r.read_many([("sequential", None, b"get")]) == [(True, b"0")]
    assert asked == [False]  # not asked again for a sequential-only frame
