"""The stream layer's ``scriba shell`` verbs (registered through :data:`SHELL_VERBS`).

``stream-list [NAMESPACE]`` (the namespaces, or one namespace's streams),
``stream-info NS/STREAM`` (segments with their ledgers, first and last positions,
sizes and states; the OPEN segment as far as its last add confirmed; cursors and
settings), ``stream-append NS/STREAM [--file F | -]`` (one record per line, or
``--whole``), ``stream-tail NS/STREAM [--from POS] [--count N] [--follow]``,
``stream-truncate NS/STREAM --before POS``, ``stream-retention NS/STREAM`` (or
``--namespace NS``: every stream of it), ``stream-delete NS/STREAM`` (or
``--namespace NS [--recursive]``). Every verb takes ``--json``. A stream is named
``NAMESPACE/STREAM``: the part after the last ``/`` is the stream (stream names hold
no ``/``). Failures are typed ``scriba.errors`` printed as one line (exit code 1).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from scriba.errors import ConfigError
from scriba.shell import ShellVerb, emit, table

TAIL_COUNT_MAX = 1_000_000
APPEND_LOCK_TIMEOUT_S = 10.0


def split_stream(text: str) -> tuple[str, str]:
    """``"prod/payments/orders"`` -> ``("prod/payments", "orders")``, names checked."""
    from scriba.stream.settings import check_name, check_namespace_name

    namespace, sep, stream = text.rpartition("/")
    if not sep or not namespace or not stream:
        raise ConfigError(f"{text!r}: expected NAMESPACE/STREAM, e.g. prod/payments/orders")
    return check_namespace_name(namespace), check_name(stream)


def payload_view(payload: bytes) -> dict[str, Any]:
    try:
        return {"payload": payload.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": payload.hex(), "encoding": "hex"}


def _headers_view(headers: Mapping[str, bytes]) -> dict[str, Any]:
    return {k: payload_view(v)["payload"] for k, v in headers.items()}


@asynccontextmanager
async def _namespace(args: argparse.Namespace, uri: str, name: str, password: str | None, *,
                     create: bool = False) -> AsyncIterator[Any]:
    from scriba.client.shell import shell_connect
    from scriba.stream import open_namespace

    async with shell_connect(uri, getattr(args, "client_tls", None)) as client:
        yield await open_namespace(client, name, create=create, password=(password or "").encode())


# --- listings ------------------------------------------------------------------------
def stream_row(record: Any) -> dict[str, Any]:
    open_seqs = [s.seq for s in record.segments if s.is_open]
    return {
        "stream": record.name, "state": record.state.value, "segments": len(record.segments),
        "records": record.record_count, "size_bytes": record.size_bytes, "writer_epoch": record.writer_epoch,
        "truncated_before": str(record.truncated_before), "open_segment": open_seqs[-1] if open_seqs else None,
    }


async def cmd_stream_list(args: argparse.Namespace, uri: str) -> int:
    from scriba.client.shell import shell_connect
    from scriba.stream import list_namespaces, open_namespace

    async with shell_connect(uri, getattr(args, "client_tls", None)) as client:
        if args.namespace is None:
            names = sorted(await list_namespaces(client))
            emit(args, [{"namespace": n} for n in names], "\n".join(names) or "(no namespaces)")
            return 0
        ns = await open_namespace(client, args.namespace)
        rows = [stream_row((await ns.catalog.read_stream(name)).value) for name in sorted(await ns.list_streams())]
    cols = ["stream", "state", "segments", "records", "size_bytes", "writer_epoch", "truncated_before", "open_segment"]
    emit(args, rows, table(rows, cols))
    return 0


def segment_row(segment: Any, summary: Any) -> dict[str, Any]:
    """One segment for ``stream-info``: ``summary`` is the recorded one, or the OPEN segment's so far."""
    from scriba.stream.position import Position

    has = summary.record_count > 0
    return {
        "seq": segment.seq, "ledger_id": segment.ledger_id, "state": segment.state.value,
        "writer_epoch": segment.writer_epoch, "records": summary.record_count, "size_bytes": summary.size_bytes,
        "entries": summary.last_entry_id + 1,
        "first_position": str(Position(segment.seq, 0, 0)) if has else None,
        "last_position": str(Position(segment.seq, summary.last_entry_id, summary.last_slot)) if has else None,
        "last_publish_ms": summary.last_publish_ms, "ctime_ms": segment.ctime_ms, "closed_ms": segment.closed_ms,
    }


async def stream_info(ns: Any, stream: str) -> dict[str, Any]:
    import dataclasses

    info = await ns.info(stream)
    record = info.record
    segments = [segment_row(segment, await ns.segment_summary(segment)) for segment in record.segments]
    settings = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in dataclasses.asdict(info.settings).items()}
    return {
        "namespace": ns.name, **stream_row(record), "next_seq": record.next_seq,
        "deleting_ledgers": list(record.deleting), "segments": segments,
        "cursors": {name: str(p) for name, p in sorted(info.cursors.items())}, "settings": settings,
    }


def format_info(doc: dict[str, Any]) -> str:
    head = (f"stream {doc['namespace']}/{doc['stream']} ({doc['state']}): {len(doc['segments'])} segments, "
            f"writer epoch {doc['writer_epoch']}, truncated before {doc['truncated_before']}")
    cols = ["seq", "ledger_id", "state", "records", "size_bytes", "first_position", "last_position"]
    cursors = "\n".join(f"cursor {name}: {pos}" for name, pos in doc["cursors"].items()) or "(no cursors)"
    return "\n".join([head, table(doc["segments"], cols), cursors])


async def cmd_stream_info(args: argparse.Namespace, uri: str) -> int:
    namespace, stream = split_stream(args.stream)
    async with _namespace(args, uri, namespace, args.password) as ns:
        doc = await stream_info(ns, stream)
    emit(args, doc, format_info(doc))
    return 0


# --- appending and tailing -----------------------------------------------------------------
def split_records(data: bytes, *, whole: bool) -> list[bytes]:
    """One record per line (the line end dropped), or ``whole``: the input is one record."""
    if whole:
        return [data]
    return [line[:-1] if line.endswith(b"\n") else line for line in data.splitlines(keepends=True)]


def parse_headers(pairs: list[str]) -> dict[str, bytes]:
    headers: dict[str, bytes] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--header {pair!r}: expected KEY=VALUE")
        headers[key] = value.encode()
    return headers


async def cmd_stream_append(args: argparse.Namespace, uri: str) -> int:
    from scriba.stream import WriterOptions

    namespace, stream = split_stream(args.stream)
    headers = parse_headers(args.header)
    source = sys.stdin.buffer.read if args.file in (None, "-") else Path(args.file).read_bytes
    try:
        records = split_records(await asyncio.to_thread(source), whole=args.whole)
    except OSError as exc:
        raise ConfigError(f"--file {args.file}: {exc.strerror}") from None
    if not records:
        raise ConfigError("stream-append: no records to append (empty input)")
    async with _namespace(args, uri, namespace, args.password, create=args.create) as ns:
        writer = await ns.open_writer(stream, create=args.create,
                                      options=WriterOptions(lock_timeout_s=args.lock_timeout))
        try:
            positions = await writer.append_many([(r, headers or None) for r in records])
        except BaseException:
            await writer.abort()
            raise
        await writer.close()
    rows = [{"position": str(p), "bytes": len(r)} for p, r in zip(positions, records, strict=True)]
    emit(args, rows, f"appended {len(rows)} records to {args.stream}: {positions[0]} .. {positions[-1]}")
    return 0


async def tail(ns: Any, stream: str, start: Any, *, count: int | None, follow: bool) -> AsyncIterator[Any]:
    """Records from ``start``, ``count`` of them at most; without ``follow``, up to the
    last record confirmed when the tail began."""
    if not follow:
        async for record in ns.read_range(stream, start, count=count):
            yield record
        return
    seen = 0
    async with await ns.open_reader(stream, start) as reader:
        async for record in reader:
            yield record
            seen += 1
            if count is not None and seen >= count:
                return


async def cmd_stream_tail(args: argparse.Namespace, uri: str) -> int:
    from scriba.stream.position import Position

    namespace, stream = split_stream(args.stream)
    if args.count is not None and not 1 <= args.count <= TAIL_COUNT_MAX:
        raise ConfigError(f"--count: 1..{TAIL_COUNT_MAX}, got {args.count}")
    start = args.start if args.start in ("earliest", "latest") else Position.parse(args.start)
    rows: list[dict[str, Any]] = []
    async with _namespace(args, uri, namespace, args.password) as ns:
        async for record in tail(ns, stream, start, count=args.count, follow=args.follow):
            row = {"position": str(record.position), **payload_view(record.payload),
                   "headers": _headers_view(record.headers), "publish_time_ms": record.publish_time_ms}
            rows.append(row)
            if not args.json:
                shown = row["payload"] if row["encoding"] == "utf-8" else "0x" + row["payload"]
                print(f"{row['position']}\t{shown}", flush=True)
    if args.json:
        emit(args, rows, "")
    elif not rows:
        print("(no records)")
    return 0


# --- truncation, retention, deletion -------------------------------------------------------
async def cmd_stream_truncate(args: argparse.Namespace, uri: str) -> int:
    from scriba.stream.position import Position

    namespace, stream = split_stream(args.stream)
    before = Position.parse(args.before)
    async with _namespace(args, uri, namespace, args.password) as ns:
        deleted = await ns.truncate(stream, before)
        record = (await ns.catalog.read_stream(stream)).value
    doc = {"stream": args.stream, "truncated_before": str(record.truncated_before), "ledgers_deleted": list(deleted)}
    emit(args, doc, f"{args.stream}: truncated before {record.truncated_before}, {len(deleted)} ledgers deleted")
    return 0


def _target(args: argparse.Namespace) -> tuple[str, str | None]:
    """``NS/STREAM`` or ``--namespace NS`` (exactly one)."""
    from scriba.stream.settings import check_namespace_name

    if (args.stream is None) == (args.namespace is None):
        raise ConfigError("give NAMESPACE/STREAM or --namespace NAMESPACE (one of them)")
    if args.stream is not None:
        return split_stream(args.stream)
    return check_namespace_name(args.namespace), None


async def cmd_stream_retention(args: argparse.Namespace, uri: str) -> int:
    namespace, stream = _target(args)
    rows = []
    async with _namespace(args, uri, namespace, args.password) as ns:
        for name in [stream] if stream is not None else sorted(await ns.list_streams()):
            point = await ns.apply_retention(name)
            record = (await ns.catalog.read_stream(name)).value
            rows.append({"stream": f"{namespace}/{name}", "truncated": point is not None,
                         "truncated_before": str(record.truncated_before), "segments": len(record.segments)})
    emit(args, rows, table(rows, ["stream", "truncated", "truncated_before", "segments"]))
    return 0


async def cmd_stream_delete(args: argparse.Namespace, uri: str) -> int:
    namespace, stream = _target(args)
    async with _namespace(args, uri, namespace, args.password) as ns:
        if stream is not None:
            await ns.delete_stream(stream)
            doc = {"stream": args.stream, "deleted": True}
            text = f"stream {args.stream} deleted"
        else:
            await ns.delete(recursive=args.recursive)
            doc = {"namespace": namespace, "deleted": True}
            text = f"namespace {namespace} deleted"
    emit(args, doc, text)
    return 0


# --- the verbs -----------------------------------------------------------------------------
def _password(p: argparse.ArgumentParser) -> None:
    p.add_argument("--password", default=None, help="the namespace's ledger password")


def _stream(p: argparse.ArgumentParser) -> None:
    p.add_argument("stream", metavar="NAMESPACE/STREAM")
    _password(p)


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("namespace", nargs="?", default=None, help="a namespace (default: list the namespaces)")


def _append_args(p: argparse.ArgumentParser) -> None:
    _stream(p)
    p.add_argument("--file", default=None, help="read records from this file ('-' or absent: stdin)")
    p.add_argument("--whole", action="store_true", help="the whole input is one record (default: one per line)")
    p.add_argument("--header", action="append", default=[], metavar="KEY=VALUE", help="a header on every record")
    p.add_argument("--create", action="store_true", help="create the namespace and stream if missing")
    p.add_argument("--lock-timeout", type=float, default=APPEND_LOCK_TIMEOUT_S,
                   help="seconds to wait for the writer lock")


def _tail_args(p: argparse.ArgumentParser) -> None:
    _stream(p)
    p.add_argument("--from", dest="start", default="earliest", help="POS (SEG:ENTRY:SLOT), earliest or latest")
    p.add_argument("--count", type=int, default=None, help="stop after N records")
    p.add_argument("--follow", action="store_true", help="keep waiting for new records")


def _truncate_args(p: argparse.ArgumentParser) -> None:
    _stream(p)
    p.add_argument("--before", required=True, metavar="POS", help="delete whole segments before this position")


def _target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("stream", metavar="NAMESPACE/STREAM", nargs="?", default=None)
    p.add_argument("--namespace", default=None, help="every stream of this namespace")
    _password(p)


def _delete_args(p: argparse.ArgumentParser) -> None:
    _target_args(p)
    p.add_argument("--recursive", action="store_true", help="with --namespace: delete its streams too")


SHELL_VERBS = (
    ShellVerb("stream-list", "namespaces, or the streams of one", cmd_stream_list, _list_args),
    ShellVerb("stream-info", "a stream's segments, positions, sizes and cursors", cmd_stream_info, _stream),
    ShellVerb("stream-append", "append records (one per line) from a file or stdin", cmd_stream_append,
              _append_args),
    ShellVerb("stream-tail", "print a stream's records", cmd_stream_tail, _tail_args),
    ShellVerb("stream-truncate", "delete whole segments before a position", cmd_stream_truncate, _truncate_args),
    ShellVerb("stream-retention", "apply the retention settings now", cmd_stream_retention, _target_args),
    ShellVerb("stream-delete", "delete a stream (or a namespace)", cmd_stream_delete, _delete_args),
)
