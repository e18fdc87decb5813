"""The ``scriba`` command: one entry point, commands registered by the modules that own them.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed ``argparse.Namespace`` and returning an
exit code. Modules are imported lazily so ``scriba --help`` stays fast and a
missing optional part only breaks its own command. The command modules are found by
name, so this module imports no layer (tests/test_layers.py holds it to that); the
layers' ``scriba shell`` verbs are found the same way by :mod:`scriba.shell`.

Logging: the commands log at info level unless ``--log-level`` says otherwise; a
program that embeds the library and configures nothing gets warnings only
(:mod:`scriba.log`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scriba import __version__
from scriba.errors import ScribaError
from scriba.grpc_runtime import apply_defaults as apply_grpc_defaults
from scriba.log import configure
from scriba.shell import import_if_present

# command modules, in the order ``scriba --help`` lists them
COMMAND_MODULES = (
    "scriba.sandbox_cli",      # scriba sandbox
    "scriba.local_cluster",    # scriba local-cluster (terraform's local environment)
    "scriba.bookie.cli",       # scriba bookie run|format
    "scriba.shell",            # scriba shell <verb> (verbs registered by each layer)
    "scriba.client.bench",     # scriba bench
    "scriba.autorecovery.cli",  # scriba autorecovery run|<verb>
    "scriba.geo.cli",          # scriba geo replicate
    "scriba.pipeline.cli",     # scriba pipeline export|audit (Spark jobs)
    "scriba.console.cli",      # scriba console (the web console)
    "scriba.demo",             # scriba demo (metadata API demo)
    "scriba.testing.faults_cli",  # scriba faults-proxy
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scriba", description="Scriba: replicated logs and state machines")
    parser.add_argument("--version", action="version", version=f"scriba {__version__}")
    parser.add_argument("--log-json", action="store_true", help="log as JSON lines")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = import_if_present(name)
        if module is not None:  # else that part is not built yet
            module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    apply_grpc_defaults()  # before any command module imports gRPC
    parser = build_parser()
    args = parser.parse_args(argv)
    configure(json=args.log_json, level=args.log_level)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except ScribaError as exc:
        print(f"scriba: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
