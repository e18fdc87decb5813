"""``scriba bookie run|format``: run one bookie in the foreground, or (re)format its dirs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from scriba import eventloop
from scriba.config import parse_host_port
from scriba.errors import ConfigError
from scriba.grpc_runtime import apply_defaults as apply_grpc_defaults
from scriba.meta.records import DEFAULT_RACK, DEFAULT_REGION, DEFAULT_ZONE
from scriba.tls_cli import add_tls_arguments, tls_from_args


def register(subparsers: Any) -> None:
    bookie = subparsers.add_parser("bookie", help="run or format a bookie (storage server)")
    verbs = bookie.add_subparsers(dest="bookie_command", metavar="VERB")

    run = verbs.add_parser("run", help="run one bookie in the foreground (SIGTERM stops it cleanly)")
    _common(run)
    run.add_argument("--listen", required=True, help="HOST:PORT of the gRPC service")
    run.add_argument("--binary-port", default="0",
                     help="port of the binary data path on the --listen host (0: any free port; "
                          "'off': none, clients use gRPC)")
    run.add_argument("--id", dest="bookie_id", help="bookie id (default: the listen address)")
    run.add_argument("--advertise", help="HOST other machines use to reach this bookie")
    run.add_argument("--region", default=DEFAULT_REGION)
    run.add_argument("--zone", default=DEFAULT_ZONE)
    run.add_argument("--rack", default=DEFAULT_RACK)
    run.add_argument("--http", help="HOST:PORT for /health and /metrics")
    run.add_argument("--entry-size-max", type=int, default=None, help="largest entry in bytes")
    run.add_argument("--inflight-bytes-max", type=int, default=None, help="per connection")
    run.add_argument("--gc-interval-s", type=float, default=None,
                     help="seconds between GC cycles (deleted ledgers, dead entry logs, compaction)")
    for kind, threshold, interval in (("minor", 0.2, "3600"), ("major", 0.8, "86400")):
        run.add_argument(f"--{kind}-compaction-threshold", type=float, default=None,
                         help=f"{kind} compaction: entry logs under this live ratio (default {threshold}; 0: off)")
        run.add_argument(f"--{kind}-compaction-interval-s", type=float, default=None,
                         help=f"seconds between {kind} compactions (default {interval}; 0: only on request)")
    run.add_argument("--compaction-rate-bytes-per-s", type=float, default=None,
                     help="compaction throttle: entry-log bytes scanned per second (0: unlimited)")
    run.add_argument("--compaction-rate-entries-per-s", type=float, default=None,
                     help="compaction throttle: entries copied per second (0: unlimited)")
    run.add_argument("--session-timeout-s", type=float, default=None, help="metadata session")
    run.add_argument("--start-timeout-s", type=float, default=None,
                     help="how long each metadata step of start-up (connect, cookie check, registration) "
                          "retries a lost connection or session before the bookie exits (default 30)")
    run.add_argument(
        "--storage",
        choices=["disk", "memory"],
        default="disk",
        help="memory: the in-memory twin, nothing durable (tests and benchmarks only)",
    )
    run.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage tunable (StorageConfig field), e.g. journal_group_wait_ms_max=0.5",
    )
    add_tls_arguments(run)
    run.set_defaults(func=_run)

    fmt = verbs.add_parser("format", help="give a bookie fresh dirs and a new cookie")
    _common(fmt)
    fmt.add_argument("--id", dest="bookie_id", required=True, help="bookie id")
    fmt.add_argument("--force", action="store_true", help="wipe non-empty dirs, replace the cookie")
    fmt.set_defaults(func=_format)

    bookie.set_defaults(func=lambda args: (bookie.print_help(), 2)[1])


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", required=True, help="metadata URI (etcd://..., zk://...)")
    parser.add_argument("--data", required=True, type=Path, help="ledger data dir")
    parser.add_argument("--journal", type=Path, default=None, help="journal dir (default: under --data)")


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--storage-option {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_config(args: argparse.Namespace) -> Any:
    from scriba.bookie.config import BookieConfig

    host, port = parse_host_port(args.listen)
    extra: dict[str, Any] = {}
    if args.http:
        extra["http_host"], extra["http_port"] = parse_host_port(args.http)
    if args.entry_size_max is not None:
        extra["entry_size_max"] = args.entry_size_max
        extra["read_range_bytes_max"] = max(args.entry_size_max, 8 * 1024 * 1024)
    if args.inflight_bytes_max is not None:
        extra["inflight_bytes_per_connection_max"] = args.inflight_bytes_max
    for name in ("gc_interval_s", "minor_compaction_threshold", "minor_compaction_interval_s",
                 "major_compaction_threshold", "major_compaction_interval_s",
                 "compaction_rate_bytes_per_s", "compaction_rate_entries_per_s"):
        if getattr(args, name) is not None:
            extra[name] = getattr(args, name)
    if args.session_timeout_s is not None:
        extra["metadata_session_timeout_s"] = args.session_timeout_s
    if args.start_timeout_s is not None:
        extra["metadata_start_timeout_s"] = args.start_timeout_s
    binary = str(getattr(args, "binary_port", "0"))
    try:
        extra["binary_port"] = None if binary == "off" else int(binary)
    except ValueError:
        raise ConfigError(f"--binary-port {binary!r}: expected a port number or 'off'") from None
    return BookieConfig(
        metadata_uri=args.metadata,
        data_dir=args.data,
        journal_dir=args.journal,
        listen_host=host,
        listen_port=port,
        bookie_id=args.bookie_id,
        advertised_host=args.advertise,
        region=args.region,
        zone=args.zone,
        rack=args.rack,
        storage_options=dict(_parse_option(o) for o in args.storage_option),
        tls=tls_from_args(args),
        **extra,
    ).validate()


def _run(args: argparse.Namespace) -> int:
    from scriba.bookie.server import Bookie

    config = build_config(args)
    factory = None
    if args.storage == "memory":
        from scriba.bookie.memory_storage import InMemoryLedgerStorage

        async def memory_storage(storage_config: Any) -> Any:
            return InMemoryLedgerStorage(entry_size_max=storage_config.entry_size_max)

        factory = memory_storage

    async def main() -> int:
        return await Bookie(config, storage_factory=factory).run_until_signal()

    return eventloop.run(main())


def _format(args: argparse.Namespace) -> int:
    from scriba.bookie.config import BookieConfig
    from scriba.bookie.cookie import format_bookie
    from scriba.bookie.server import check_dirs
    from scriba.meta.connect import connect

    config = BookieConfig(
        metadata_uri=args.metadata, data_dir=args.data, journal_dir=args.journal, bookie_id=args.bookie_id
    ).validate()
    check_dirs(config)

    async def main() -> int:
        store = await connect(config.metadata_uri)
        try:
            cookie = await format_bookie(
                store, config.resolved_bookie_id, config.cookie_dirs, [config.data_dir], force=args.force
            )
        finally:
            await store.close()
        print(f"formatted bookie {cookie.bookie_id}: instance {cookie.instance_id}, "
              f"dirs {', '.join(str(d) for d in config.cookie_dirs)}")
        return 0

    return eventloop.run(main())


def main(argv: list[str] | None = None) -> int:
    """``python -m scriba.bookie.cli run|format ...``: the bookie commands alone.

    Same behaviour as ``scriba bookie ...``, without importing the other command modules
    (child processes started by tests and benchmarks use this). Sets up the process's
    logging (``--log-json``, ``--log-level``), then :func:`run_command`.
    """
    from scriba.log import configure

    args = parse_command(argv)
    configure(json=args.log_json, level=args.log_level)
    return run_command(args)


def parse_command(argv: list[str] | None = None) -> argparse.Namespace:
    """``main``'s command line, global flags anywhere (``sys.argv[1:]`` when None)."""
    apply_grpc_defaults()  # before the bookie imports gRPC
    import sys

    parser = argparse.ArgumentParser(prog="scriba bookie")
    parser.add_argument("--log-json", action="store_true")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(sub)
    rest = list(sys.argv[1:] if argv is None else argv)
    front: list[str] = []  # global flags may come anywhere
    for flag in ("--log-json", "--log-level"):
        if flag in rest:
            i = rest.index(flag)
            take = 2 if flag == "--log-level" else 1
            front += rest[i : i + take]
            del rest[i : i + take]
    return parser.parse_args([*front, "bookie", *rest])


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; its exit code. Leaves logging as it is: a caller in another
    program's process (``scriba local-cluster``'s format step, tests) keeps its own."""
    import sys

    from scriba.errors import ScribaError

    try:
        code: int = args.func(args)
    except ScribaError as exc:
        print(f"scriba: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
