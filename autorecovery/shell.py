"""Autorecovery's verbs for ``scriba shell`` (``SHELL_VERBS``, found by ``scriba.shell``).

    list-underreplicated [--json]     every record: ledger, fragments, bookies, claim
    audit-now [--full]                ask the elected auditor for a checking pass now
    recover-bookie BOOKIE             re-replicate everything on BOOKIE now (gone or not)
    decommission BOOKIE               drain a live BOOKIE, then mark it removable
    autorecovery-status [--json]      auditor leader and token, last checks, records, claims

``recover-bookie`` and ``decommission`` mark every fragment that uses the bookie, then
repair here (beside any running workers: claims keep them apart) with progress on
stderr until no ledger references it; ``--mark-only`` leaves the copying to workers.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from scriba.ids import BookieId
from scriba.shell import ShellVerb, emit


async def _with_store(uri: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    from scriba.meta import connect

    store = await connect(uri)
    try:
        return await fn(store)
    finally:
        await store.close()


async def cmd_list(args: argparse.Namespace, uri: str) -> int:
    from scriba.autorecovery.commands import list_underreplicated

    rows = await _with_store(uri, list_underreplicated)
    lines = [f"{r['ledger_id']:>20}  fragments {r['fragments']}  bookies {','.join(r['bookies'])}"
             f"{'  claimed by ' + r['claimed_by'] if r['claimed_by'] else ''}"
             f"{'  error: ' + r['last_error'] if r['last_error'] else ''}" for r in rows]
    emit(args, rows, "\n".join(lines) or "(none)")
    return 0


async def cmd_audit_now(args: argparse.Namespace, uri: str) -> int:
    from scriba.autorecovery.commands import request_audit

    seq = await _with_store(uri, lambda s: request_audit(s, full=args.full))
    emit(args, {"sequence": seq, "full": args.full},
          f"audit requested (#{seq}{', full' if args.full else ''}); the elected auditor runs it")
    return 0


def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--full", action="store_true", help="read every entry of every replica")


def _drain_args(p: argparse.ArgumentParser) -> None:
    from scriba.autorecovery.cli import add_config_arguments

    p.add_argument("bookie", help="bookie id")
    p.add_argument("--mark-only", action="store_true", help="mark only; leave copying to workers")
    add_config_arguments(p)


async def _drain(args: argparse.Namespace, uri: str, decommission: bool) -> int:
    from scriba.autorecovery import commands
    from scriba.autorecovery.cli import config_from, print_progress
    from scriba.autorecovery.records import Reason
    from scriba.client.shell import shell_connect

    bookie = BookieId(args.bookie)
    reason = Reason.DECOMMISSION if decommission else Reason.RECOVER
    async with shell_connect(uri, getattr(args, "client_tls", None)) as client:
        if decommission:
            await commands.start_decommission(client.store, bookie)
        if args.mark_only:
            n = await commands.mark_bookie(client.store, bookie, reason)
            emit(args, {"bookie_id": bookie, "ledgers_marked": n}, f"{bookie}: {n} ledgers marked")
            return 0
        total = await commands.drain(client, bookie, config_from(args), reason,
                                     progress=print_progress(bookie))
        doc: dict[str, Any] = {"bookie_id": bookie, "ledgers_moved": total}
        if decommission:
            done = await commands.finish_decommission(client.store, bookie)
            doc["state"] = done.state.value
        emit(args, doc, f"{bookie}: {total} ledgers moved off"
              + ("; no ledger references it: it may be removed" if decommission else ""))
    return 0


async def cmd_recover_bookie(args: argparse.Namespace, uri: str) -> int:
    return await _drain(args, uri, decommission=False)


async def cmd_decommission(args: argparse.Namespace, uri: str) -> int:
    return await _drain(args, uri, decommission=True)


async def cmd_status(args: argparse.Namespace, uri: str) -> int:
    from scriba.autorecovery.commands import status

    doc = await _with_store(uri, status)
    leader = doc["auditor_leader"]
    auditor = doc["auditor"] or {}
    lines = [
        f"auditor: {leader['candidate'] + ' (token ' + str(leader['token']) + ')' if leader else 'none elected'}",
        f"lost bookies: {', '.join(auditor.get('lost_bookies', [])) or 'none'}; "
        f"within the delay: {auditor.get('pending_bookies') or 'none'}",
        f"under-replicated: {doc['underreplicated_ledgers']} ledgers, {doc['underreplicated_fragments']} fragments; "
        f"claims: {len(doc['claims'])}",
        f"decommissions: {doc['decommissions'] or 'none'}",
    ]
    emit(args, doc, "\n".join(lines))
    return 0


SHELL_VERBS = (
    ShellVerb("list-underreplicated", "under-replicated ledgers, their fragments, bookies and claims",
              cmd_list),
    ShellVerb("audit-now", "ask the elected auditor to check every ledger now", cmd_audit_now,
              _audit_args),
    ShellVerb("recover-bookie", "re-replicate everything on BOOKIE now (progress shown)",
              cmd_recover_bookie, _drain_args),
    ShellVerb("decommission", "drain a live BOOKIE, then mark it removable (progress shown)",
              cmd_decommission, _drain_args),
    ShellVerb("autorecovery-status", "auditor leader and token, last checks, under-replication, claims",
              cmd_status),
)
