"""``scriba pipeline export|audit|compact|gc-staged``: the Spark jobs from the command line.

Each command starts a SparkSession (``--master``, default ``local[2]``; Spark prints
its stage progress on the console), runs the job and ends with a one-line summary
(``--json``: one JSON object). ``audit`` exits 1 when it found a problem. pyspark is
imported only when a command runs, so ``scriba --help`` works without the extra.
``--tls-cert/--tls-key/--tls-ca`` (files every executor can read): the driver and every
task dial the bookies over mutual TLS (the data source's ``tls.*`` options).
``gc-staged`` starts no Spark: it collects exactly-once jobs' staging sets left by
dead drivers (:mod:`scriba.pipeline.staging`).
"""

from __future__ import annotations

import argparse
from typing import Any

from scriba.tls_cli import add_tls_arguments, tls_from_args


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("pipeline", help="Spark jobs over streams and ledgers (needs scriba[spark])")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    e = verbs.add_parser("export", help="streams to Parquet (partitioned by namespace/stream/date); resumes")
    _common(e)
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--stream", action="append", default=[], help="NS/STREAM (repeatable)")
    which.add_argument("--namespace", help="every stream of this namespace")
    e.add_argument("--to", required=True, metavar="DIR", help="the Parquet directory")
    e.add_argument("--format", default="parquet", choices=["parquet"], help="output format")
    e.add_argument("--skip-truncated", action="store_true",
                   help="a stream truncated past the last export skips ahead (else an error)")
    e.set_defaults(func=cmd_export)

    a = verbs.add_parser("audit", help="every replica of every entry and every ensemble's placement")
    _common(a)
    scope = a.add_mutually_exclusive_group()
    scope.add_argument("--namespace", help="the segment ledgers of this namespace's streams")
    scope.add_argument("--ledgers", help="comma-separated ledger ids (default: every ledger)")
    a.add_argument("--no-digest", action="store_true", help="check headers only (password unknown)")
    a.add_argument("--out", metavar="DIR", help="also write the problems as Parquet")
    a.set_defaults(func=cmd_audit)

    c = verbs.add_parser("compact", help="an RSM group's snapshot built from its command stream, restore-checked")
    _common(c)
    c.add_argument("--stream", required=True, help="NS/NAME: the group's command stream")
    c.add_argument("--machine", required=True, metavar="MODULE:ATTR",
                   help="the state machine's zero-argument factory, e.g. scriba.examples.kvstore.machine:KvMachine")
    c.add_argument("--up-to", default="latest", metavar="POSITION", help="end (exclusive; default: the end now)")
    c.set_defaults(func=cmd_compact)

    g = verbs.add_parser("gc-staged", help="delete exactly-once jobs' staged ledgers left by dead drivers")
    g.add_argument("--metadata", required=True, help="metadata URI, e.g. etcd://127.0.0.1:2379/prod")
    g.add_argument("--password", default="", help="the namespaces' password")
    g.add_argument("--stream", help="NS/STREAM (default: every stream)")
    g.add_argument("--grace-s", type=float, default=None, metavar="SECONDS",
                   help="collect staging sets older than this (default: one day; a job that may still "
                        "commit must be younger)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_tls_arguments(g, server=False)
    g.set_defaults(func=cmd_gc_staged)


def cmd_gc_staged(args: argparse.Namespace) -> int:
    """No Spark: the collector runs on this process's connection."""
    import json

    from scriba.errors import ConfigError
    from scriba.pipeline.access import Access
    from scriba.pipeline.commit import collect_staged
    from scriba.pipeline.plan import STAGING_GRACE_S_DEFAULT, split_stream

    grace_s = STAGING_GRACE_S_DEFAULT if args.grace_s is None else args.grace_s
    if not grace_s >= 0:
        raise ConfigError(f"--grace-s must be >= 0, got {grace_s}")
    stream = "/".join(split_stream(args.stream)) if args.stream else None
    with Access(args.metadata, args.password.encode(), tls=tls_from_args(args)) as access:
        report = collect_staged(access, stream=stream, grace_s=grace_s)
    print(json.dumps(vars(report), sort_keys=True) if args.json else report.line())
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metadata", required=True, help="metadata URI, e.g. etcd://127.0.0.1:2379/prod")
    p.add_argument("--password", default="", help="the ledgers' / namespace's password")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_tls_arguments(p, server=False)  # the certificate the driver and every task dial the bookies with


def _session(args: argparse.Namespace) -> tuple[Any, bool]:
    """(the session, whether this command started it and so stops it)."""
    from pyspark.sql import SparkSession

    from scriba.pipeline import local_session, register

    active = SparkSession.getActiveSession()
    if active is not None:  # called from a program that has one (tests, notebooks)
        register(active)
        return active, False
    return local_session(args.master, f"scriba-pipeline-{args.verb}"), True


def _release(spark: Any, owned: bool) -> None:
    """Stop the session (and its JVM) if this command started it."""
    if owned:
        from scriba.pipeline import stop_session

        stop_session(spark)


def cmd_export(args: argparse.Namespace) -> int:
    from scriba.pipeline.jobs.export import export

    spark, owned = _session(args)
    try:
        report = export(spark, args.metadata, args.to, streams=tuple(args.stream), namespace=args.namespace,
                        password=args.password, fail_on_data_loss=not args.skip_truncated, tls=tls_from_args(args))
    finally:
        _release(spark, owned)
    print(report.to_json() if args.json else report.line())
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from scriba.pipeline.jobs.audit import audit
    from scriba.pipeline.plan import parse_ledger_ids

    spark, owned = _session(args)
    try:
        problems, report = audit(spark, args.metadata, namespace=args.namespace,
                                 ledgers=tuple(parse_ledger_ids(args.ledgers or "")),
                                 password=None if args.no_digest else args.password, tls=tls_from_args(args))
        if args.out:
            problems.write.mode("overwrite").parquet(args.out)
        elif not args.json:
            problems.show(20, truncate=False)
    finally:
        _release(spark, owned)
    print(report.to_json() if args.json else report.line())
    return 0 if report.healthy else 1


def cmd_compact(args: argparse.Namespace) -> int:
    from scriba.pipeline.jobs.compact import compact, machine_factory

    factory = machine_factory(args.machine)
    spark, owned = _session(args)
    try:
        report = compact(spark, args.metadata, args.stream, factory, up_to=args.up_to, password=args.password,
                         tls=tls_from_args(args))
    finally:
        _release(spark, owned)
    print(report.to_json() if args.json else report.line())
    return 0
