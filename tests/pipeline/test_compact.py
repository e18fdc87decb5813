"""``compact`` on real bookies and etcd with the shared local[2] Spark: the KV example's
command log (RSM envelopes under a client session, with a retried command that must
not apply twice and a delete) becomes a snapshot in the group's catalog whose restored
state equals a replay through the client alone; a second run starts from it and reads
only what came after; a machine whose restore loses state is caught (the negative
control of the digest proof)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from _pipeline_support import _ns, main

from scriba.client import Client
from scriba.errors import ConfigError, SnapshotCorruptError
from scriba.examples.kvstore import commands as cmd
from scriba.examples.kvstore.machine import KvMachine
from scriba.pipeline.jobs.compact import compact, machine_factory
from scriba.rsm import RsmConfig, SnapshotReader
from scriba.rsm import membership as mb
from scriba.rsm.envelope import Envelope, Kind
from scriba.rsm.snapshot_store import digest_of, load_newest, read_catalog, read_snapshot
from scriba.rsm.state import ReplicatedState
from scriba.stream import open_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

aetcd_rpc = pytest.importorskip("aetcd.rpc.rpc_pb2")
CFG = RsmConfig()
SESSION = 1  # the first session the table opens


def _put(seq: int, key: str, value: str) -> bytes:
    body = cmd.encode(cmd.Op.PUT, aetcd_rpc.PutRequest(key=key.encode(), value=value.encode()))
    return Envelope(Kind.COMMAND, 1, 1000 + seq, body, SESSION, seq, seq).encode()


def _delete(seq: int, key: str) -> bytes:
    body = cmd.encode(cmd.Op.DELETE_RANGE, aetcd_rpc.DeleteRangeRequest(key=key.encode()))
    return Envelope(Kind.COMMAND, 1, 1000 + seq, body, SESSION, seq, seq).encode()


def _log(first_seq: int, count: int) -> list[bytes]:
    """``count`` puts over 40 keys (each overwritten), from session seq ``first_seq``."""
    return [_put(first_seq + i, f"k{i % 40}", f"v{first_seq + i}") for i in range(count)]


async def _write(uri: str, ns: str, records: list[bytes]) -> None:
    async with Client.connect(uri) as client:
        namespace = await open_namespace(client, ns, create=True, segment_records_max=500)
        writer = await namespace.open_writer("kv", create=True)
        for i in range(0, len(records), 100):
            await writer.append_many([(r, None) for r in records[i:i + 100]])
        await writer.close()


async def _replay(uri: str, ns: str) -> ReplicatedState:
    """The state a replica reaches by tailing the whole stream (the client alone)."""
    state = ReplicatedState(KvMachine(), session_ttl_ms=CFG.session_ttl_ms,
                            session_results_max=CFG.session_results_max)
    async with Client.connect(uri) as client:
        namespace = await open_namespace(client, ns)
        async with await namespace.open_reader("kv", "earliest") as reader:
            while (rec := await reader.read_next(timeout_s=1.0)) is not None:
                state.apply(rec.position, Envelope.decode(rec.payload))
    return state


async def _restored(uri: str, ns: str) -> tuple[Any, ReplicatedState]:
    state = ReplicatedState(KvMachine(), session_ttl_ms=CFG.session_ttl_ms,
                            session_results_max=CFG.session_results_max)
    async with Client.connect(uri) as client:
        found = await load_newest(client, mb.catalog_key(mb.group_token(ns, "kv")))
    assert found is not None
    state.restore(found[1])
    return found[0], state


def _value(state: ReplicatedState, key: str) -> bytes | None:
    machine = state.machine
    assert isinstance(machine, KvMachine)
    found = machine.space.range(key.encode(), b"", machine.revision)
    return found[0].value if found else None


def test_compact_kv_log_to_a_snapshot_the_rsm_restores(spark: Any, uri: str) -> None:
    ns = _ns()
    head = [Envelope(Kind.SESSION_OPEN, 1, 1000).encode(), *_log(1, 400)]
    stale = _put(3, "k2", "stale-retry")  # a retry of seq 3 after seq 400 was acked: never applied
    records = [*head, stale, _put(401, "gone", "x"), _delete(402, "gone"), *_log(403, 300)]
    asyncio.run(_write(uri, ns, records))

    report = compact(spark, uri, f"{ns}/kv", KvMachine, max_records_per_partition=250)
    assert report.started_from is None and report.records_read == len(records)
    replayed = asyncio.run(_replay(uri, ns))
    assert report.digest == digest_of(replayed.snapshot(CFG.snapshot_chunk_bytes))
    assert report.position == str(replayed.applied)
    info, restored = asyncio.run(_restored(uri, ns))
    assert (info.ledger_id, str(info.position)) == (report.ledger_id, report.position)
    # last write wins per key, the retried command did not apply again, the delete holds
    assert _value(restored, "k2") == f"v{403 + 282}".encode()  # the last put of k2: i = 282 (i % 40 == 2)
    assert _value(restored, "k39") == f"v{403 + 279}".encode()
    assert _value(restored, "gone") is None
    assert _value(replayed, "k2") == _value(restored, "k2")
    naive: dict[bytes, bytes] = {}  # negative control: last write wins without the session table takes the retry
    for r in [*head, stale]:
        env = Envelope.decode(r)
        if env.kind is Kind.COMMAND:
            put = aetcd_rpc.PutRequest.FromString(cmd.decode(env.payload)[2])
            naive[put.key] = put.value
    assert naive[b"k2"] == b"stale-retry"

    # a second run starts from the snapshot and reads only what came after it
    more = _log(703, 120)
    asyncio.run(_write(uri, ns, more))
    again = compact(spark, uri, f"{ns}/kv", KvMachine)
    assert again.started_from == report.position and again.records_read == len(more)
    replayed = asyncio.run(_replay_after_truncation(uri, ns, report.position))
    assert again.digest == digest_of(replayed.snapshot(CFG.snapshot_chunk_bytes))
    assert json.loads(again.to_json())["records_applied"] == len(records) + len(more)


async def _replay_after_truncation(uri: str, ns: str, position: str) -> ReplicatedState:
    """The first snapshot restored, then the stream after it: what a new replica does."""
    state = ReplicatedState(KvMachine(), session_ttl_ms=CFG.session_ttl_ms,
                            session_results_max=CFG.session_results_max)
    async with Client.connect(uri) as client:
        catalog_key = mb.catalog_key(mb.group_token(ns, "kv"))
        first = next(i for i in (await read_catalog(client, catalog_key)).snapshots if str(i.position) == position)
        state.restore(await read_snapshot(client, first))
        namespace = await open_namespace(client, ns)
        async with await namespace.open_reader("kv", position) as reader:
            while (rec := await reader.read_next(timeout_s=1.0)) is not None:
                if str(rec.position) != position:
                    state.apply(rec.position, Envelope.decode(rec.payload))
    return state


class _LossyKv(KvMachine):
    """Restores every key but the last: the digest proof must refuse its snapshot."""

    def restore(self, src: SnapshotReader) -> None:
        doc = json.loads(src.read())
        doc["versions"] = doc["versions"][:-1]
        super().restore(SnapshotReader([json.dumps(doc).encode()]))


def test_compact_refuses_a_snapshot_whose_restore_loses_state(spark: Any, uri: str) -> None:
    ns = _ns()
    asyncio.run(_write(uri, ns, [Envelope(Kind.SESSION_OPEN, 1, 1000).encode(), *_log(1, 60)]))
    with pytest.raises(SnapshotCorruptError, match="restored state's digest"):
        compact(spark, uri, f"{ns}/kv", _LossyKv)
    compact(spark, uri, f"{ns}/kv", KvMachine)  # the same log, a faithful machine: verified


def test_compact_command_line(spark: Any, uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    ns = _ns()
    asyncio.run(_write(uri, ns, [Envelope(Kind.SESSION_OPEN, 1, 1000).encode(), *_log(1, 30)]))
    args = ["pipeline", "compact", "--metadata", uri, "--stream", f"{ns}/kv",
            "--machine", "scriba.examples.kvstore.machine:KvMachine"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (out["records_read"], out["started_from"]) == (31, None)
    assert main(args) == 0 and "verified" in capsys.readouterr().out  # nothing new: the same snapshot
    for bad in ("nomodule", "scriba.examples.kvstore.machine:Nope", "no.such.module:X"):
        with pytest.raises(ConfigError, match="--machine"):
            machine_factory(bad)
