"""Geo-replication's verbs for ``scriba shell`` (``SHELL_VERBS``, found by ``scriba.shell``).

``geo-status --source URI --stream NS/STREAM``: the lag of the link from the source into
this cluster (``--metadata``), measured from both streams (see ``scriba.geo.status``).
"""

from __future__ import annotations

import argparse
import contextlib

from scriba.geo.cli import add_link_arguments, split_stream
from scriba.shell import ShellVerb, emit, table


def _arguments(p: argparse.ArgumentParser) -> None:
    add_link_arguments(p)
    p.add_argument("--stream", action="append", required=True, help="NS/STREAM (repeatable)")
    p.add_argument("--local-only", action="store_true", help="the link ships only the source's own records")


async def cmd_status(args: argparse.Namespace, uri: str) -> int:
    from scriba.client.shell import shell_connect
    from scriba.geo.replicator import Cluster
    from scriba.geo.status import link_status
    from scriba.stream import open_namespace

    rows = []
    async with contextlib.AsyncExitStack() as stack:
        tls = getattr(args, "client_tls", None)  # one certificate for both clusters' bookies
        source = await stack.enter_async_context(shell_connect(args.source, tls))
        target = await stack.enter_async_context(shell_connect(uri, tls))
        for text in args.stream:
            ns_name, stream = split_stream(text)
            src = Cluster(args.source_name or args.source, await open_namespace(source, ns_name))
            dst = Cluster(args.target_name or uri, await open_namespace(target, ns_name))
            status = await link_status(src, dst, stream, local_only=args.local_only)
            rows.append({"stream": text, **status.to_json()})
    emit(args, rows, table(rows, ["stream", "confirmed", "source_end", "records_behind", "seconds_behind"]))
    return 0


SHELL_VERBS = (ShellVerb("geo-status", "replication lag of a link into this cluster", cmd_status, _arguments),)
