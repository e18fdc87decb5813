"""Autorecovery's operator verbs: ``SHELL_VERBS`` for ``scriba shell``, also under
``scriba autorecovery``.

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
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from scriba.ids import BookieId

Run = Callable[[argparse.Namespace, str], Awaitable[int]]


def _none(parser: argparse.ArgumentParser) -> None:
    """No arguments of its own."""


try:  # the shell registry (scriba.shell.ShellVerb) where it has landed
    from scriba.shell import ShellVerb as _ShellVerb  # type: ignore[import-not-found]
except ModuleNotFoundError:
    _ShellVerb = None


@dataclass(frozen=True, slots=True)
class Verb:
    name: str
    help: str
    run: Run
    arguments: Callable[[argparse.ArgumentParser], None] = _none


def _emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    if getattr(args, "json", False):
        json.dump(doc, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(text)


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
    _emit(args, rows, "\n".join(lines) or "(none)")
    return 0


async def cmd_audit_now(args: argparse.Namespace, uri: str) -> int:
    from scriba.autorecovery.commands import request_audit

    seq = await _with_store(uri, lambda s: request_audit(s, full=args.full))
    _emit(args, {"sequence": seq, "full": args.full},
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
    from scriba.client import Client

    bookie = BookieId(args.bookie)
    reason = Reason.DECOMMISSION if decommission else Reason.RECOVER
    async with Client.connect(uri) as client:
        if decommission:
            await commands.start_decommission(client.store, bookie)
        if args.mark_only:
            n = await commands.mark_bookie(client.store, bookie, reason)
            _emit(args, {"bookie_id": bookie, "ledgers_marked": n}, f"{bookie}: {n} ledgers marked")
            return 0
        total = await commands.drain(client, bookie, config_from(args), reason,
                                     progress=print_progress(bookie))
        doc: dict[str, Any] = {"bookie_id": bookie, "ledgers_moved": total}
        if decommission:
            done = await commands.finish_decommission(client.store, bookie)
            doc["state"] = done.state.value
        _emit(args, doc, f"{bookie}: {total} ledgers moved off"
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
    _emit(args, doc, "\n".join(lines))
    return 0


VERBS = (
    Verb("list-underreplicated", "under-replicated ledgers, their fragments, bookies and claims", cmd_list),
    Verb("audit-now", "ask the elected auditor to check every ledger now", cmd_audit_now, _audit_args),
    Verb("recover-bookie", "re-replicate everything on BOOKIE now (progress shown)", cmd_recover_bookie,
         _drain_args),
    Verb("decommission", "drain a live BOOKIE, then mark it removable (progress shown)", cmd_decommission,
         _drain_args),
    Verb("autorecovery-status", "auditor leader and token, last checks, under-replication, claims",
         cmd_status),
)

SHELL_VERBS = () if _ShellVerb is None else tuple(
    _ShellVerb(v.name, v.help, v.run, v.arguments) for v in VERBS
)
