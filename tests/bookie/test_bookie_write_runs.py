"""The run-shaped write path of the disk storage: the journal record built from a blob,
the run-based write cache, whole-run admission (same answers as add-by-add admission)
and batches of several runs (with and without the caller's blob and sizes) surviving
checkpoints and a restart; the run records of the index."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as hs

from scriba.bookie import journal as jr
from scriba.bookie.ledger_index import run_records
from scriba.bookie.ledger_state import LedgerState, _admit_each, admit_runs
from scriba.bookie.storage import open_storage
from scriba.bookie.storage_api import AddColumns, StorageConfig
from scriba.bookie.storage_writes import adds_record
from scriba.bookie.write_cache import WriteCache
from scriba.entry import Crc32cDigest, pack_entry
from scriba.errors import Status
from scriba.testing.waiting import eventually

KEY = b"k" * 32
OTHER = b"o" * 32
DIGEST = Crc32cDigest()


def entry(lid: int, eid: int, lac: int = -1, size: int = 40, tag: bytes = b"a") -> bytes:
    return pack_entry(DIGEST, lid, eid, lac, 0, (tag * size)[:size])


# --- the journal record -------------------------------------------------------------


@given(hs.lists(hs.integers(16, 300), min_size=1, max_size=40), hs.booleans(), hs.integers(0, 3))
def test_adds_record_is_the_journal_format(sizes: list[int], same: bool, keys: int) -> None:
    if same:
        sizes = [sizes[0]] * len(sizes)
    rnd = random.Random(len(sizes))
    entries = [rnd.randbytes(n) for n in sizes]
    prefix = [jr.encode_master_key(i, KEY) for i in range(keys)]
    record = adds_record(list(sizes), b"".join(entries), entries, list(prefix))
    assert record == b"".join(prefix) + jr.encode_adds(entries)
    assert adds_record(list(sizes), None, entries, list(prefix)) == record
    body = jr.encode_adds(entries)[jr.REC_HEADER_SIZE :]
    assert jr.decode_adds(body) == entries


# --- the write cache against a dict model ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["run", "put", "drop"]), hs.integers(1, 3),
                          hs.integers(0, 40), hs.integers(1, 6)), max_size=60))
def test_write_cache_matches_a_dict(ops: list[tuple[str, int, int, int]]) -> None:
    cache = WriteCache()
    model: dict[tuple[int, int], bytes] = {}
    for i, (kind, lid, eid, n) in enumerate(ops):
        if kind == "drop":
            cache.drop_ledger(lid)
            model = {k: v for k, v in model.items() if k[0] != lid}
        elif kind == "put":
            data = b"%d/%d/%d" % (lid, eid, i)
            assert cache.put(lid, eid, data) == ((lid, eid) not in model)
            model.setdefault((lid, eid), data)
        else:
            top = max([e for (lg, e) in model if lg == lid], default=-1)
            first = max(eid, top + 1) if i % 2 else eid  # odd ops: a new run; even: maybe overlapping
            run = [b"%d/%d/r%d" % (lid, e, i) for e in range(first, first + n)]
            cache.append_run(lid, first, run, sum(map(len, run)))
            for e, data in zip(range(first, first + n), run, strict=True):
                model.setdefault((lid, e), data)
        assert cache.count == len(model)
        assert cache.bytes == sum(map(len, model.values()))
    for (lid, eid), data in model.items():
        assert cache.get(lid, eid) == data and cache.has(lid, eid)
    for lid in range(1, 4):
        for eid in range(0, 60):
            if (lid, eid) not in model:
                assert cache.get(lid, eid) is None and not cache.has(lid, eid)
    seen: dict[tuple[int, int], bytes] = {}
    order: list[int] = []
    for lid, eids, run in cache.segments():
        order.append(lid)
        assert len(eids) == len(run)
        for eid, data in zip(eids, run, strict=True):
            assert (lid, eid) not in seen
            seen[(lid, eid)] = data
    assert seen == model
    assert order == sorted(order)


# --- admission: whole runs decide as add by add -----------------------------------------


def _states() -> dict[int, LedgerState]:
    fenced = LedgerState(KEY, fenced=True, last_entry_id=4)
    return {1: LedgerState(KEY, last_entry_id=9), 2: LedgerState(KEY), 3: fenced,
            4: LedgerState(OTHER, last_entry_id=2)}


@settings(max_examples=300, deadline=None)
@given(hs.data())
def test_admit_runs_answers_as_add_by_add(data: hs.DataObject) -> None:
    runs = data.draw(hs.lists(hs.tuples(
        hs.integers(1, 5),  # ledger (5: unknown)
        hs.integers(0, 14),  # first id
        hs.integers(1, 8),  # count
        hs.sampled_from(["plain", "gap", "down", "badhdr", "bigsize", "mixsize", "key", "recovery"]),
    ), min_size=1, max_size=4))
    lids: list[int] = []
    eids: list[int] = []
    keys: list[bytes] = []
    entries: list[bytes] = []
    recovery: list[bool] = []
    for lid, first, count, kind in runs:
        ids = list(range(first, first + count))
        if kind == "gap":
            ids = [first + 2 * k for k in range(count)]
        elif kind == "down" and count > 1:
            ids = ids[::-1]
        for k, eid in enumerate(ids):
            size = 40 + (k if kind == "mixsize" else 0)
            e = entry(lid, eid, eid - 1, size)
            if kind == "badhdr" and k == count // 2:
                e = entry(lid, eid + 1, eid - 1, size)
            if kind == "bigsize" and k == 0:
                e = entry(lid, eid, eid - 1, 500)
            lids.append(lid)
            eids.append(eid)
            keys.append(OTHER if kind == "key" and k == count - 1 else KEY)
            entries.append(e)
            recovery.append(kind == "recovery")
    with_blob = data.draw(hs.booleans())
    adds = AddColumns(lids, eids, keys, entries, recovery if any(recovery) else None,
                      b"".join(entries) if with_blob else None,
                      [len(e) for e in entries] if with_blob else None)
    stored = {(1, e) for e in range(10)} | {(3, e) for e in range(5)} | {(4, e) for e in range(3)}

    def has(lid: int, eid: int) -> bool:
        return (lid, eid) in stored

    keyed_fast: list[tuple[int, bytes]] = []
    join = data.draw(hs.booleans())
    adm = admit_runs(_states(), adds, 300, has, keyed_fast, join=join)
    keyed_each: list[tuple[int, bytes]] = []
    statuses, accepted = _admit_each(_states(), adds, 300, has, keyed_each)
    assert adm.statuses == statuses
    assert adm.accepted() == accepted
    assert adm.count == len(accepted)
    assert sorted(set(keyed_fast)) == sorted(set(keyed_each))
    for run in adm.runs:
        ids = list(run.entry_ids)
        assert ids == eids[run.start : run.stop]
        assert list(run.entries) == entries[run.start : run.stop]
        assert run.nbytes == sum(map(len, run.entries))
        assert run.lac == max(int.from_bytes(e[16:24], "big", signed=True) for e in run.entries)
        assert run.consecutive == (ids == list(range(ids[0], ids[0] + len(ids))))
    assert adm.blob == (b"".join(entries) if join or with_blob else None)
    assert adm.sizes == [len(e) for e in entries]


def test_new_runs_take_the_whole_run_path() -> None:
    ids1 = list(range(10, 18))
    ids2 = [0, 2, 4]
    entries = [entry(1, e, e - 1) for e in ids1] + [entry(2, e, 7, 50 + e) for e in ids2]
    adds = AddColumns([1] * 8 + [2] * 3, ids1 + ids2, [KEY] * 11, entries)
    keyed: list[tuple[int, bytes]] = []
    adm = admit_runs(_states(), adds, 300, lambda lid, eid: False, keyed)
    assert adm.statuses == [Status.OK] * 11 and not adm.rest
    assert [(r.ledger_id, r.start, r.stop, r.consecutive, r.lac) for r in adm.runs] == [
        (1, 0, 8, True, 16), (2, 8, 11, False, 7)]
    assert keyed == [(1, KEY), (2, KEY)]


# --- the disk storage: runs of several ledgers, restart ---------------------------------


def _run_cols(parts: list[tuple[int, list[int]]], *, blob: bool) -> AddColumns:
    lids: list[int] = []
    eids: list[int] = []
    entries: list[bytes] = []
    for lid, ids in parts:
        lids += [lid] * len(ids)
        eids += ids
        entries += [entry(lid, e, e - 1, 300) for e in ids]
    return AddColumns(lids, eids, [KEY] * len(lids), entries, None,
                      b"".join(entries) if blob else None,
                      [len(e) for e in entries] if blob else None)


async def test_runs_of_several_ledgers_survive_checkpoints_and_restart(tmp_path: Path) -> None:
    cfg = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600,
                        write_cache_bytes_max=64 * 1024)
    expected: dict[tuple[int, int], bytes] = {}
    s = await open_storage(cfg)
    try:
        for lid in (1, 2, 3):  # create the ledgers
            assert await s.add_columns(_run_cols([(lid, [0])], blob=False)) == [Status.OK]
        batches: list[list[tuple[int, list[int]]]] = []
        for b in range(40):
            first = 1 + 16 * b
            batches.append([(1, list(range(first, first + 16))),
                            (2, list(range(first, first + 32, 2))),  # striped: every other id
                            (3, list(range(first, first + 16)))])
        for b, parts in enumerate(batches):
            if b == 20:
                await s.checkpoint()
            cols = _run_cols(parts, blob=b % 2 == 0)
            assert await s.add_columns(cols) == [Status.OK] * len(cols)
        # late and duplicate adds: ids below the ledger's last, some already stored
        late = _run_cols([(2, [2, 4, 3]), (1, [5, 6])], blob=True)
        assert await s.add_columns(late) == [Status.OK] * 5
        for lid in (1, 2, 3):
            expected[(lid, 0)] = entry(lid, 0, -1, 300)
        for parts in [*batches, [(2, [3])]]:
            for lid, ids in parts:
                for e in ids:
                    expected.setdefault((lid, e), entry(lid, e, e - 1, 300))
        for (lid, e), data in expected.items():
            assert s.read_entry(lid, e) == data
        assert s.lac_state(1).last_entry_id == 640
        assert s.lac_state(1).lac == 639
        assert s.stats()["checkpoints_total"] >= 2  # the cache bound forced flushes
    finally:
        await s.abandon()  # as a crash: the tail is only in the journal
    s = await open_storage(cfg)
    try:
        for (lid, e), data in expected.items():
            assert s.read_entry(lid, e) == data
        assert s.read_range(1, 0, 640, 1000, 1 << 30) == [expected[(1, e)] for e in range(641)]
        assert s.lac_state(3).last_entry_id == 640
    finally:
        await s.close()


async def test_run_index_across_log_rolls_sizes_and_compaction(tmp_path: Path) -> None:
    """Runs longer than one index record, split by entry-log rolls, of mixed and equal
    sizes; then a ledger deleted and its logs compacted: every entry of the other reads."""
    from scriba.bookie.ledger_index import RUN_ENTRIES_MAX

    cfg = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600,
                        entry_log_file_bytes_max=128 * 1024)
    count = RUN_ENTRIES_MAX + 700
    expected: dict[tuple[int, int], bytes] = {}
    s = await open_storage(cfg)
    try:
        for b in range(0, count, 100):
            lids: list[int] = []
            eids: list[int] = []
            entries: list[bytes] = []
            for lid in (1, 2):
                for e in range(b, min(b + 100, count)):
                    size = 100 if lid == 1 else 30 + e % 7 * 10  # ledger 2: mixed sizes
                    data = entry(lid, e, e - 1, size)
                    lids.append(lid)
                    eids.append(e)
                    entries.append(data)
                    expected[(lid, e)] = data
            cols = AddColumns(lids, eids, [KEY] * len(lids), entries, None, b"".join(entries),
                              [len(x) for x in entries])
            assert await s.add_columns(cols) == [Status.OK] * len(lids)
            if b == 2000:
                await s.checkpoint()
        await s.checkpoint()
        in_runs = 0
        for (lid, e), data in expected.items():
            got = s._index.locate(lid, e)
            assert got is not None
            in_runs += got[1] is not None
            assert s.read_entry(lid, e) == data
        assert in_runs == len(expected)  # in-order flushes index whole runs only
        logs_before = len(s._meta)
        assert logs_before > 3
        await s.delete_ledgers([2])
        await s.compact(0.9)
        assert len(s._meta) < logs_before  # sparse logs compacted away
        for e in range(count):
            assert s.read_entry(1, e) == expected[(1, e)]
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        assert s.read_range(1, 0, count - 1, count, 1 << 30) == [expected[(1, e)] for e in range(count)]
        assert 2 not in s.ledger_ids()
    finally:
        await s.close()


def test_run_records_map_every_entry_back() -> None:
    from scriba.bookie.entry_log import REC_HEADER_SIZE
    from scriba.bookie.ledger_index import RUN_ENTRIES_MAX, _run_location

    count = 2 * RUN_ENTRIES_MAX + 5
    rnd = random.Random(7)
    sizes = [rnd.randrange(16, 90) for _ in range(count)]
    listed = [100]
    for n in sizes:
        listed.append(listed[-1] + REC_HEADER_SIZE + n)
    strided = range(100, 100 + (count + 1) * 58, 58)
    for offsets, lens in ((listed, sizes), (strided, [58 - REC_HEADER_SIZE] * count)):
        records = run_records(9, 1000, 3, offsets)
        assert len(records) == 3
        firsts = []
        for key, value in records:
            first = int.from_bytes(key[8:16], "big")
            firsts.append(first)
            for k in range(RUN_ENTRIES_MAX + 1):
                e = first + k
                got = _run_location(value, k, 9, e)
                if e - 1000 < count and k < RUN_ENTRIES_MAX:
                    assert got == (3, offsets[e - 1000], lens[e - 1000])
                else:
                    assert got is None
        assert firsts == [1000, 1000 + RUN_ENTRIES_MAX, 1000 + 2 * RUN_ENTRIES_MAX]


async def test_cancelled_checkpoint_loses_nothing(tmp_path: Path) -> None:
    """A checkpoint whose caller is cancelled mid-flush (as the periodic disk check is at
    close) still ends: the swapped-out cache is indexed before any later checkpoint."""
    import asyncio
    import threading

    cfg = StorageConfig(tmp_path / "journal", tmp_path / "ledgers", checkpoint_interval_s=3600)
    s = await open_storage(cfg)
    expected = {e: entry(5, e, e - 1) for e in range(300)}
    try:
        assert await s.add_columns(_cols_of(5, range(0, 200), expected)) == [Status.OK] * 200
        release = threading.Event()
        blocker = s._executor.submit(release.wait, 10.0)  # the flush queues behind this
        task = asyncio.ensure_future(s.checkpoint())
        await eventually(lambda: s._flushing is not None, 5.0, what="the cache swapped out, its flush blocked",
                         interval_s=0.001)
        task.cancel()  # while its flush has not started
        try:
            await task
        except asyncio.CancelledError:
            pass
        release.set()
        assert blocker.result(10.0)
        assert await s.add_columns(_cols_of(5, range(200, 300), expected)) == [Status.OK] * 100
    finally:
        await s.close()
    s = await open_storage(cfg)
    try:
        assert s.read_range(5, 0, 299, 300, 1 << 30) == [expected[e] for e in range(300)]
    finally:
        await s.close()


def _cols_of(lid: int, ids: range, entries: dict[int, bytes]) -> AddColumns:
    return AddColumns([lid] * len(ids), list(ids), [KEY] * len(ids), [entries[e] for e in ids])
