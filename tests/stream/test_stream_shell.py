"""``scriba shell stream-*`` against real bookies and etcd: every verb, ``--json`` and text,
and bad input as one typed line (exit code 1)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scriba.client import Client
from scriba.stream import Position, open_namespace
from scriba.testing.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SCRIBA = [sys.executable, "-m", "scriba.cli", "--log-level", "error"]
NS = "shell/ns"


def shell(uri: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*SCRIBA, "shell", "--metadata", uri, *args], input=stdin, capture_output=True,
                          timeout=120)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def ok_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_line_error(done: subprocess.CompletedProcess[str], kind: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("scriba:")]
    assert len(lines) == 1 and kind in lines[0], done.stderr
    assert "Traceback" not in done.stderr


async def run(uri: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(shell, uri, *args, stdin=stdin)


async def test_stream_verbs_on_a_cluster(bookie_cluster: Any, metadata_uri: str, tmp_path: Path) -> None:
    bookie_cluster.start_bookies(3, zones=["z1", "z2", "z3"])
    uri = metadata_uri
    # append: lines from stdin (creating namespace and stream), then a whole binary file
    appended = ok_json(await run(uri, "--json", "stream-append", f"{NS}/orders", "--create",
                                 "--header", "origin=eu", stdin=b"one\ntwo\nthree\n"))
    assert [row["bytes"] for row in appended] == [3, 3, 5]
    positions = [Position.parse(row["position"]) for row in appended]
    assert positions == sorted(positions) and len({p.entry_id for p in positions}) == 1  # one record set
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x00\xffbinary\nwith newline")
    (binary,) = ok_json(await run(uri, "stream-append", f"{NS}/orders", "--file", str(blob), "--whole", "--json"))
    text = await run(uri, "stream-append", f"{NS}/orders", stdin=b"four\n")
    assert text.returncode == 0 and "appended 1 records" in text.stdout, text.stderr

    # list and info, with a writer holding an OPEN segment and a cursor
    async with Client.connect(uri) as client:
        ns = await open_namespace(client, NS)
        writer = await ns.open_writer("orders")
        for i in range(5):
            await writer.append(b"open-%d" % i)

        async def lac_sent() -> bool:
            return await ns.last_position("orders") == Position(writer.segment_seq, 4, 0)

        await eventually(lac_sent, 20, interval_s=0.05,
                         what="the idle writer sent its LAC after explicit_lac_delay_s")
        await ns.commit_cursor("orders", "reader-eu", positions[1])
        await ns.create_stream("empty")

        namespaces = ok_json(await run(uri, "stream-list", "--json"))
        assert {"namespace": NS} in namespaces
        rows = ok_json(await run(uri, "stream-list", NS, "--json"))
        assert [r["stream"] for r in rows] == ["empty", "orders"]
        (orders,) = [r for r in rows if r["stream"] == "orders"]
        assert orders["records"] == 5 and orders["open_segment"] == writer.segment_seq
        listed = await run(uri, "stream-list", NS)
        assert listed.returncode == 0 and "OPEN_SEGMENT" in listed.stdout and "orders" in listed.stdout

        info = ok_json(await run(uri, "stream-info", f"{NS}/orders", "--json"))
        segments = info["segments"]
        assert [s["state"] for s in segments] == ["closed"] * (len(segments) - 1) + ["open"]
        assert sum(s["records"] for s in segments) == 10
        first = segments[0]
        assert first["records"] == 3 and first["first_position"] == str(positions[0])
        assert first["last_position"] == str(positions[2]) and first["size_bytes"] > 11
        opened = segments[-1]
        assert opened["records"] == 5 and opened["last_position"] == str(Position(writer.segment_seq, 4, 0))
        ledgers = {s["ledger_id"] for s in segments}
        for ledger_id in ledgers:
            assert (await client.ledger_metadata(ledger_id)).ledger_id == ledger_id
        assert info["cursors"] == {"reader-eu": str(positions[1])}
        assert info["settings"]["ensemble_size"] == 3 and info["writer_epoch"] == writer.token
        shown = await run(uri, "stream-info", f"{NS}/orders")
        assert shown.returncode == 0 and "reader-eu" in shown.stdout and "LEDGER_ID" in shown.stdout

        # tail: everything confirmed now, from a position, a count; text shows binary as hex
        tailed = ok_json(await run(uri, "stream-tail", f"{NS}/orders", "--json"))
        assert [r["payload"] for r in tailed] == ["one", "two", "three", b"\x00\xffbinary\nwith newline".hex(),
                                                  "four", *(f"open-{i}" for i in range(5))]
        assert tailed[0]["headers"] == {"origin": "eu"} and tailed[3]["encoding"] == "hex"
        assert tailed[4]["position"] == text.stdout.split()[-1]
        assert binary["position"] == tailed[3]["position"]
        some = ok_json(await run(uri, "stream-tail", f"{NS}/orders", "--from", str(positions[1]),
                                 "--count", "2", "--json"))
        assert [r["payload"] for r in some] == ["two", "three"]
        plain = await run(uri, "stream-tail", f"{NS}/orders", "--count", "4")
        assert plain.stdout.splitlines()[3] == f"{tailed[3]['position']}\t0x{tailed[3]['payload']}"
        assert ok_json(await run(uri, "stream-tail", f"{NS}/orders", "--from", "latest", "--json")) == []
        assert ok_json(await run(uri, "stream-tail", f"{NS}/empty", "--json")) == []
        await writer.close()

    # truncate, then retention (a stream whose settings drop every closed segment)
    cut = Position.parse(tailed[4]["position"])
    done = ok_json(await run(uri, "stream-truncate", f"{NS}/orders", "--before", str(cut), "--json"))
    assert done["truncated_before"] == str(cut) and len(done["ledgers_deleted"]) == cut.segment_seq
    async with Client.connect(uri) as client:
        for ledger_id in done["ledgers_deleted"]:
            assert ledger_id not in await client.list_ledgers()
        ns = await open_namespace(client, NS)
        w = await ns.open_writer("kept", create=True, segment_records_max=1, retention_bytes_max=1)
        for i in range(4):
            await w.append(b"k%d" % i)
        await w.close()
    assert ok_json(await run(uri, "stream-tail", f"{NS}/orders", "--count", "1", "--json"))[0]["payload"] == "four"
    one_line_error(await run(uri, "stream-tail", f"{NS}/orders", "--from", str(positions[0])),
                   "PositionTruncatedError")
    retained = ok_json(await run(uri, "stream-retention", "--namespace", NS, "--json"))
    by_name = {r["stream"]: r for r in retained}
    assert by_name[f"{NS}/kept"]["truncated"] and by_name[f"{NS}/kept"]["segments"] == 1
    assert not by_name[f"{NS}/empty"]["truncated"]
    again = ok_json(await run(uri, "stream-retention", f"{NS}/kept", "--json"))
    assert again == [{**by_name[f"{NS}/kept"], "truncated": False}]

    # delete a stream, then the namespace (refused while it holds streams)
    assert ok_json(await run(uri, "stream-delete", f"{NS}/orders", "--json")) == {"stream": f"{NS}/orders",
                                                                                 "deleted": True}
    assert [r["stream"] for r in ok_json(await run(uri, "stream-list", NS, "--json"))] == ["empty", "kept"]
    one_line_error(await run(uri, "stream-delete", "--namespace", NS), "NamespaceNotEmptyError")
    assert ok_json(await run(uri, "stream-delete", "--namespace", NS, "--recursive", "--json"))["deleted"]
    assert {"namespace": NS} not in ok_json(await run(uri, "stream-list", "--json"))


async def test_stream_verbs_refuse_bad_input_with_one_typed_line(bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(3, zones=["z1", "z2", "z3"])
    uri = metadata_uri
    ok_json(await run(uri, "stream-append", f"{NS}/s", "--create", "--json", stdin=b"only\n"))
    cases = [
        (("stream-info", "noslash"), "ConfigError"),
        (("stream-info", "bad name/s"), "ConfigError"),
        (("stream-info", "no/such/stream"), "NamespaceNotFoundError"),
        (("stream-list", "no/such"), "NamespaceNotFoundError"),
        (("stream-info", f"{NS}/missing"), "StreamNotFoundError"),
        (("stream-tail", f"{NS}/s", "--from", "1:2"), "InvalidPositionError"),
        (("stream-tail", f"{NS}/s", "--from", "7:0:0"), "PositionOutOfRangeError"),
        (("stream-tail", f"{NS}/s", "--count", "0"), "ConfigError"),
        (("stream-truncate", f"{NS}/s", "--before", "99:0:0"), "PositionOutOfRangeError"),
        (("stream-truncate", f"{NS}/s", "--before", "x"), "InvalidPositionError"),
        (("stream-append", f"{NS}/missing"), "StreamNotFoundError"),
        (("stream-append", f"{NS}/s", "--header", "novalue"), "ConfigError"),
        (("stream-append", f"{NS}/s", "--file", "/no/such/file"), "ConfigError"),
        (("stream-delete",), "ConfigError"),
        (("stream-delete", f"{NS}/s", "--namespace", NS), "ConfigError"),
        (("stream-retention", f"{NS}/missing"), "StreamNotFoundError"),
    ]
    limit = asyncio.Semaphore(4)  # a few commands at once on a busy machine

    async def bounded(*args: str) -> subprocess.CompletedProcess[str]:
        async with limit:
            return await run(uri, *args, stdin=b"x\n")

    results = await asyncio.gather(*(bounded(*args) for args, _ in cases))
    for (args, kind), done in zip(cases, results, strict=True):
        try:
            one_line_error(done, kind)
        except AssertionError as exc:
            raise AssertionError(f"{args}: {exc}") from None
    one_line_error(await run(uri, "stream-append", f"{NS}/s", stdin=b""), "ConfigError")
    # nothing written by any of them: the stream holds its one record
    assert [r["payload"] for r in ok_json(await run(uri, "stream-tail", f"{NS}/s", "--json"))] == ["only"]
