"""The console's mirror and views on a ``memory://`` store: the watched tree follows records
as they come and go (an RSM group's members and leader under its stream; a deleted stream
takes them along), and the pages change without the console reading the store per view."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from scriba.console.cli import Console
from scriba.console.probe import BookieProbe, Prober
from scriba.console.views import LedgerQuery, Model
from scriba.ids import BookieId
from scriba.meta.records import BookieRegistration, LedgerMetadata, bookie_key, ledger_key
from scriba.meta.store import MetadataStore
from scriba.rsm import membership as mb
from scriba.stream.position import Position
from scriba.stream.segments import (
    CursorRecord,
    NamespaceRecord,
    StreamRecord,
    cursor_key,
    namespace_key,
    stream_key,
)
from tests.console.conftest import until


def _claim(candidate: str) -> bytes:
    return json.dumps({"candidate": candidate, "nonce": "n", "value": ""}).encode()


async def test_rsm_group_members_and_leader_follow_the_store(memory_console: tuple[MetadataStore, Console]) -> None:
    store, console = memory_console
    model = console.model
    await store.create(namespace_key("apps"), NamespaceRecord("apps").to_bytes())
    await store.create(stream_key("apps", "counter"), StreamRecord("counter").to_bytes())
    group = mb.group_token("apps", "counter")
    for i, role in enumerate(["leader", "follower"]):
        member = mb.Member(f"r{i}", f"127.0.0.1:{7000 + i}", zone=f"z{i}", role=role, token=5, applied="0:3:0")
        await store.create(mb.member_key(group, member.replica_id), member.to_bytes())
    election = f"elections/{mb.election_name(group)}/leader"
    version = await store.create(election, _claim("r0"))

    groups = await until("the group with its leader", lambda: [
        g for g in model.rsm_groups() if g["leader"] == "r0" and len(g["members"]) == 2])
    [g] = groups
    assert (g["namespace"], g["name"]) == ("apps", "counter")
    assert [(m["replica_id"], m["role"], m["token"], m["applied"]) for m in g["members"]] == [
        ("r0", "leader", 5, "0:3:0"), ("r1", "follower", 5, "0:3:0")]

    # the leader moves: r0's registration goes (it died), r1 wins the election
    await store.delete(mb.member_key(group, "r0"))
    await store.set(election, _claim("r1"), expected_version=version)
    await until("r1 leads, r0 gone", lambda: [
        g for g in model.rsm_groups() if g["leader"] == "r1" and [m["replica_id"] for m in g["members"]] == ["r1"]])

    # the stream (the group's log) is deleted: its watches stop and its records go
    await store.delete(stream_key("apps", "counter"))
    await until("the group gone", lambda: model.rsm_groups() == [])
    assert console.mirror.status()["watches"] == 7  # the six roots and the namespace's streams


async def test_ledgers_appear_and_bad_records_are_skipped(memory_console: tuple[MetadataStore, Console]) -> None:
    store, console = memory_console
    model = console.model
    for lid in (3, 1, 2):
        md = LedgerMetadata(lid, 3, 2, 2, ((0, ("b1", "b2", "b3")),))
        await store.create(ledger_key(lid), md.to_bytes())
    await store.create(ledger_key(9), b"not a ledger")  # malformed: not shown, nothing breaks
    doc = await until("three ledgers", lambda: (d := model.ledgers(LedgerQuery())) and d["total"] == 3 and d)
    assert [row["ledger_id"] for row in doc["ledgers"]] == [1, 2, 3]
    assert model.ledgers(LedgerQuery(per_page=2, page=2))["ledgers"][0]["ledger_id"] == 3
    await store.delete(ledger_key(2))
    await until("ledger 2 gone", lambda: model.ledgers(LedgerQuery())["total"] == 2)
    ledger = model.ledger(1)
    assert [b["state"] for b in ledger["fragments"][0]["bookies"]] == ["down"] * 3  # none registered



async def test_a_bookie_is_down_only_once_a_probe_failed(memory_console: tuple[MetadataStore, Console]) -> None:
    """A registered bookie whose first probe is still in flight is not shown down (the console
    had shown every bookie down until its first probe answered: the API test's race)."""
    store, console = memory_console
    model = Model(console.mirror)
    model.prober = Prober(dict, interval_s=1.0)  # never started: the test sets its probes
    await store.create(bookie_key("b1"), BookieRegistration(BookieId("b1"), "127.0.0.1:1", zone="z1",
                                                            http_address="127.0.0.1:2").to_bytes())
    await until("b1 registered", lambda: model.registrations())

    def state() -> str:
        [row] = model.bookies()
        return str(row["state"])

    assert state() == "writable"  # not probed yet
    probe = model.prober.probes["b1"] = BookieProbe("127.0.0.1:2")
    probe.probed_s = time.time()  # the first probe started and has not answered
    assert state() == "writable"
    probe.up, probe.error = False, "ClientConnectorError: refused"
    assert state() == "down"
    probe.up, probe.error = True, ""  # it answers again
    assert state() == "writable"
    await store.delete(bookie_key("b1"))  # its registration goes: down whatever the probe said
    await until("b1 down once unregistered", lambda: state() == "down")


async def test_a_streams_cursors_truncation_and_retention_shown(memory_console: tuple[MetadataStore, Console]) -> None:
    store, console = memory_console
    await store.create(namespace_key("apps"), NamespaceRecord("apps").to_bytes())
    settings = {"retention_age_s_max": 3600.0, "retention_bytes_max": 1 << 30}
    await store.create(stream_key("apps", "orders"), StreamRecord(
        "orders", settings=settings, truncated_before=Position(2, 5), next_seq=3).to_bytes())
    await store.create(cursor_key("apps", "orders", "billing"), CursorRecord("billing", Position(2, 9)).to_bytes())

    def orders() -> dict[str, Any] | None:
        rows = [s for ns in console.model.streams()["namespaces"] for s in ns["streams"]]
        return rows[0] if rows and rows[0]["cursors"] else None

    stream = await until("the stream with its cursor", orders)
    assert (stream["truncated_before"], stream["settings"]) == (str(Position(2, 5)), settings)
    assert [(c["name"], c["position"]) for c in stream["cursors"]] == [("billing", str(Position(2, 9)))]
    async with aiohttp.ClientSession() as http, http.get(console.url + "streams") as reply:
        page = await reply.text()
    assert f"truncated before {Position(2, 5)}" in page and f"billing at {Position(2, 9)}" in page
    assert "retention_age_s_max" in page and "3600" in page
