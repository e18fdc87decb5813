"""``scriba shell``: operator commands against a running cluster.

The client layer's verbs, registered through :data:`SHELL_VERBS` (the command and
what every verb shares live in :mod:`scriba.shell`): ``list-bookies``,
``list-ledgers``, ``ledger-metadata ID``, ``read-ledger ID``, ``delete-ledger ID``,
``recover-ledger ID``, ``simple-test`` (write, read back, verify, report),
``placement-explain`` and ``placement-check``. Every listing takes ``--json``.
Failures are typed ``scriba.errors`` printed as one line by the CLI (exit code 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from scriba.errors import ConfigError, NoSuchKeyError, NoSuchLedgerError, ScribaError
from scriba.ids import LedgerId
from scriba.meta.records import (
    BOOKIES_PREFIX,
    LEDGERS_PREFIX,
    BookieRegistration,
    LedgerMetadata,
    ledger_key,
)
from scriba.meta.store import MetadataStore
from scriba.shell import ShellVerb, bounded, emit, table
from scriba.tls import TlsConfig

SIMPLE_TEST_PASSWORD = b"scriba-simple-test"
SIMPLE_TEST_WINDOW = 256  # appends in flight
READ_LEDGER_ENTRIES_MAX = 100_000


async def _open_store(uri: str) -> MetadataStore:
    from scriba.meta.connect import connect

    return await connect(uri)


def shell_connect(uri: str, tls: TlsConfig | None = None) -> Any:
    """``Client.connect`` of a shell verb (await it, or ``async with`` it); ``tls``: dial the
    bookies over TLS (``args.client_tls``: ``scriba shell --tls-*``, or the client
    certificate a ``scriba sandbox --tls`` wrote into sandbox.json). Every layer's verbs
    connect through this."""
    from scriba.client import Client, ClientConfig

    return Client.connect(uri, config=ClientConfig(tls=tls))


async def _connect_client(uri: str, tls: TlsConfig | None = None) -> Any:
    return await shell_connect(uri, tls)


def _password(text: str | None) -> bytes:
    return text.encode() if text is not None else b""


# --- listings -----------------------------------------------------------------------


async def list_bookies(store: MetadataStore) -> list[BookieRegistration]:
    rows = await store.list(BOOKIES_PREFIX)
    return [BookieRegistration.from_bytes(v.value) for _, v in rows]


async def list_ledgers(store: MetadataStore) -> list[LedgerMetadata]:
    return [LedgerMetadata.from_bytes(v.value) async for _, v in store.scan(LEDGERS_PREFIX)]


async def ledger_metadata(store: MetadataStore, ledger_id: int) -> LedgerMetadata:
    try:
        raw = await store.get(ledger_key(ledger_id))
    except NoSuchKeyError:
        raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
    return LedgerMetadata.from_bytes(raw.value)


def bookie_json(b: BookieRegistration) -> dict[str, Any]:
    return {
        "bookie_id": b.bookie_id,
        "address": b.address,
        "region": b.region,
        "zone": b.zone,
        "rack": b.rack,
        "mode": b.mode.value,
        "free_bytes": b.free_bytes,
        "total_bytes": b.total_bytes,
    }


def ledger_summary(m: LedgerMetadata) -> dict[str, Any]:
    return {
        "ledger_id": m.ledger_id,
        "state": m.state.value,
        "ensemble_size": m.ensemble_size,
        "write_quorum_size": m.write_quorum_size,
        "ack_quorum_size": m.ack_quorum_size,
        "last_entry_id": m.last_entry_id,
        "length": m.length,
        "segments": len(m.ensembles),
        "digest_type": m.digest_type.value,
    }


def _payload_view(payload: bytes) -> dict[str, Any]:
    try:
        return {"payload": payload.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": payload.hex(), "encoding": "hex"}


# --- simple test ----------------------------------------------------------------------


def check_simple_test_options(*, ensemble: int, write: int, ack: int, entries: int, size: int) -> None:
    """ConfigError naming the option unless each count is >= 1 and ``size`` >= 0."""
    for name, value, least in (("ensemble", ensemble, 1), ("write", write, 1), ("ack", ack, 1),
                               ("entries", entries, 1), ("size", size, 0)):
        if value < least:
            raise ConfigError(f"--{name}: must be at least {least}, got {value}")


async def simple_test(
    uri: str, *, ensemble: int = 3, write: int = 3, ack: int = 2, entries: int = 1000, size: int = 100,
    keep: bool = False, tls: TlsConfig | None = None,
) -> dict[str, Any]:
    """Write ``entries`` entries, read them back, compare, delete the ledger; a report dict.

    ConfigError (before anything is written) unless every count is at least 1 and the
    payload size at least 0: a test of nothing must not pass.
    """
    check_simple_test_options(ensemble=ensemble, write=write, ack=ack, entries=entries, size=size)
    client = await _connect_client(uri, tls)
    report: dict[str, Any] = {
        "metadata_uri": uri, "ensemble_size": ensemble, "write_quorum_size": write,
        "ack_quorum_size": ack, "entries": entries, "ok": False,
    }
    try:
        t0 = time.monotonic()
        writer = await client.create_ledger(
            ensemble_size=ensemble, write_quorum_size=write, ack_quorum_size=ack, password=SIMPLE_TEST_PASSWORD
        )
        report["ledger_id"] = int(writer.ledger_id)
        payloads = [f"simple-test entry {i} ".encode().ljust(size, b".") for i in range(entries)]
        written = 0
        for start in range(0, entries, SIMPLE_TEST_WINDOW):
            chunk = payloads[start : start + SIMPLE_TEST_WINDOW]
            ids = await asyncio.gather(*(writer.append(p) for p in chunk))
            if list(ids) != list(range(start, start + len(chunk))):
                raise ScribaError(f"append returned entry ids {ids[:3]}... for entries from {start}")
            written += len(chunk)
        await writer.close()
        t_write = time.monotonic() - t0
        report["written"] = written
        reader = await client.open_ledger(writer.ledger_id, password=SIMPLE_TEST_PASSWORD, recovery=False)
        read = mismatched = 0
        async for e in reader.read(0, entries - 1):
            if e.entry_id != read or e.payload != payloads[read]:
                mismatched += 1
            read += 1
        t_total = time.monotonic() - t0
        report.update(
            read=read,
            mismatched=mismatched,
            write_s=round(t_write, 3),
            total_s=round(t_total, 3),
            appends_per_s=round(written / t_write, 1) if t_write > 0 else 0.0,
            ok=(read == written == entries and mismatched == 0),
        )
        if not keep:
            await client.delete_ledger(writer.ledger_id)
            report["deleted"] = True
    finally:
        await client.close()
    return report


def format_simple_test(report: dict[str, Any]) -> str:
    verdict = "PASSED" if report.get("ok") else "FAILED"
    return (
        f"simple-test {verdict}: ledger {report.get('ledger_id')} "
        f"E{report['ensemble_size']}/W{report['write_quorum_size']}/A{report['ack_quorum_size']}: "
        f"wrote {report.get('written', 0)}, read {report.get('read', 0)}, "
        f"mismatched {report.get('mismatched', 0)} of {report['entries']} entries "
        f"in {report.get('total_s', 0)} s ({report.get('appends_per_s', 0)} appends/s)"
    )


def simple_test_report(uri: str, **kw: Any) -> tuple[bool, str]:
    """Run simple-test synchronously (for ``scriba sandbox --simple-test``)."""
    try:
        report = asyncio.run(bounded(simple_test(uri, **kw)))
    except ScribaError as exc:
        return False, f"simple-test FAILED: {type(exc).__name__}: {exc}"
    return bool(report["ok"]), format_simple_test(report)


# --- placement ------------------------------------------------------------------------


def _placement_options(pairs: list[str] | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _topology(bookies: list[BookieRegistration]) -> Any:
    from scriba.placement import BookieNode, Topology

    return Topology.from_nodes(
        BookieNode(b.bookie_id, b.region, b.zone, b.rack, writable=b.writable, free_bytes=b.free_bytes)
        for b in bookies
    )


def _explain_module() -> Any:
    import scriba.placement.explain as explain

    return explain


async def _with_store(uri: str, fn: Callable[[MetadataStore], Awaitable[Any]]) -> Any:
    store = await _open_store(uri)
    try:
        return await fn(store)
    finally:
        await store.close()


async def cmd_list_bookies(args: argparse.Namespace, uri: str) -> int:
    bookies = await _with_store(uri, list_bookies)
    rows = [bookie_json(b) for b in sorted(bookies, key=lambda b: b.bookie_id)]
    emit(args, rows, table(rows, ["bookie_id", "address", "region", "zone", "rack", "mode"]))
    return 0


async def cmd_list_ledgers(args: argparse.Namespace, uri: str) -> int:
    ledgers = await _with_store(uri, list_ledgers)
    rows = [ledger_summary(m) for m in ledgers]
    cols = ["ledger_id", "state", "ensemble_size", "write_quorum_size", "ack_quorum_size", "last_entry_id", "length", "segments"]
    emit(args, rows, table(rows, cols))
    return 0


async def cmd_ledger_metadata(args: argparse.Namespace, uri: str) -> int:
    m = await _with_store(uri, lambda s: ledger_metadata(s, args.ledger_id))
    doc = m.to_json()
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


async def cmd_read_ledger(args: argparse.Namespace, uri: str) -> int:
    client = await _connect_client(uri, getattr(args, "client_tls", None))
    rows: list[dict[str, Any]] = []
    try:
        reader = await client.open_ledger(LedgerId(args.ledger_id), password=_password(args.password), recovery=False)
        last = args.last
        if last is None:
            last = await _last_readable(reader)
        if last >= args.first:
            if last - args.first + 1 > READ_LEDGER_ENTRIES_MAX:
                raise ConfigError(f"--from/--to: at most {READ_LEDGER_ENTRIES_MAX} entries at a time")
            async for e in reader.read(args.first, last):
                rows.append({"entry_id": int(e.entry_id), **_payload_view(bytes(e.payload))})
        await reader.close()
    finally:
        await client.close()
    text = "\n".join(f"{r['entry_id']}\t{r['payload'] if r['encoding'] == 'utf-8' else '0x' + r['payload']}" for r in rows)
    emit(args, rows, text or "(no entries)")
    return 0


async def _last_readable(reader: Any) -> int:
    metadata = getattr(reader, "metadata", None)
    if metadata is not None and getattr(metadata, "is_closed", False):
        return int(metadata.last_entry_id)
    lac = await reader.read_last_add_confirmed()
    return int(lac)


async def cmd_delete_ledger(args: argparse.Namespace, uri: str) -> int:
    await _with_store(uri, lambda s: ledger_metadata(s, args.ledger_id))  # NoSuchLedgerError first
    client = await _connect_client(uri, getattr(args, "client_tls", None))
    try:
        await client.delete_ledger(LedgerId(args.ledger_id))
    finally:
        await client.close()
    emit(args, {"ledger_id": args.ledger_id, "deleted": True}, f"ledger {args.ledger_id} deleted")
    return 0


async def cmd_recover_ledger(args: argparse.Namespace, uri: str) -> int:
    client = await _connect_client(uri, getattr(args, "client_tls", None))
    try:
        reader = await client.open_ledger(LedgerId(args.ledger_id), password=_password(args.password), recovery=True)
        await reader.close()
    finally:
        await client.close()
    m = await _with_store(uri, lambda s: ledger_metadata(s, args.ledger_id))
    doc = {"ledger_id": args.ledger_id, "state": m.state.value, "last_entry_id": m.last_entry_id, "length": m.length}
    emit(args, doc, f"ledger {args.ledger_id} recovered: {m.state.value}, last entry {m.last_entry_id}, {m.length} bytes")
    return 0


async def cmd_simple_test(args: argparse.Namespace, uri: str) -> int:
    report = await simple_test(
        uri, ensemble=args.ensemble, write=args.write, ack=args.ack, entries=args.entries, size=args.size,
        keep=args.keep, tls=getattr(args, "client_tls", None),
    )
    emit(args, report, format_simple_test(report))
    return 0 if report["ok"] else 1


async def cmd_placement_explain(args: argparse.Namespace, uri: str) -> int:
    from scriba.placement import make_policy

    explain = _explain_module()
    policy = make_policy(args.policy, _placement_options(args.option))
    bookies = await _with_store(uri, list_bookies)
    doc = explain.explain_new_ensemble(policy, _topology(bookies), args.ensemble, args.write, args.ack)
    emit(args, doc, explain.format_explain_text(doc))
    return 0 if doc.get("ok") else 1


async def cmd_placement_check(args: argparse.Namespace, uri: str) -> int:
    from scriba.placement import make_policy

    if args.ledger_id is None and not args.all:
        raise ConfigError("placement-check: give a LEDGER_ID or --all")
    explain = _explain_module()

    async def gather(store: MetadataStore) -> tuple[list[BookieRegistration], list[LedgerMetadata]]:
        bookies = await list_bookies(store)
        if args.all:
            return bookies, await list_ledgers(store)
        return bookies, [await ledger_metadata(store, args.ledger_id)]

    bookies, ledgers = await _with_store(uri, gather)
    topology = _topology(bookies)
    docs: list[dict[str, Any]] = []
    texts: list[str] = []
    for m in ledgers:
        policy = make_policy(m.placement_policy, dict(m.placement_options))
        rows = explain.check_ledger(policy, topology, m.ensembles, m.write_quorum_size, m.ack_quorum_size)
        docs.append({"ledger_id": int(m.ledger_id), "policy": m.placement_policy,
                     "options": dict(m.placement_options), "segments": rows})
        texts.append(f"ledger {m.ledger_id} policy {m.placement_policy}:\n" + explain.format_check_text(m.ledger_id, rows))
    emit(args, docs, "\n".join(texts) or "(no ledgers)")
    failing = any(row["adherence"] == "FAIL" for d in docs for row in d["segments"])
    return 1 if failing else 0


# --- the verbs ---------------------------------------------------------------------------


def _ledger_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=int)


def _ledger_id_password(p: argparse.ArgumentParser) -> None:
    _ledger_id(p)
    p.add_argument("--password", default=None)


def _read_ledger_args(p: argparse.ArgumentParser) -> None:
    _ledger_id_password(p)
    p.add_argument("--from", dest="first", type=int, default=0)
    p.add_argument("--to", dest="last", type=int, default=None)


def _quorum_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write", type=int, default=3)
    p.add_argument("--ack", type=int, default=2)


def _simple_test_args(p: argparse.ArgumentParser) -> None:
    _quorum_args(p)
    p.add_argument("--entries", type=int, default=1000, help="entries to write (at least 1)")
    p.add_argument("--size", type=int, default=100, help="payload bytes per entry")
    p.add_argument("--keep", action="store_true", help="keep the test ledger")


def _placement_explain_args(p: argparse.ArgumentParser) -> None:
    _quorum_args(p)
    p.add_argument("--policy", default="random")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy option")


def _placement_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=int, nargs="?", default=None)
    p.add_argument("--all", action="store_true")


SHELL_VERBS = (
    ShellVerb("list-bookies", "bookies registered now", cmd_list_bookies),
    ShellVerb("list-ledgers", "every ledger with its state", cmd_list_ledgers),
    ShellVerb("ledger-metadata", "one ledger's metadata record", cmd_ledger_metadata, _ledger_id),
    ShellVerb("read-ledger", "print a ledger's entries", cmd_read_ledger, _read_ledger_args),
    ShellVerb("delete-ledger", "delete a ledger", cmd_delete_ledger, _ledger_id_password),
    ShellVerb("recover-ledger", "fence, recover and close a ledger", cmd_recover_ledger, _ledger_id_password),
    ShellVerb("simple-test", "write entries, read them back, verify", cmd_simple_test, _simple_test_args),
    ShellVerb("placement-explain", "the ensemble a policy would pick now, and why", cmd_placement_explain,
              _placement_explain_args),
    ShellVerb("placement-check", "adherence of ledgers' ensembles to their policies", cmd_placement_check,
              _placement_check_args),
)
