"""``scriba shell VERB``: operator verbs, each registered by the layer that owns it.

The shared core owns the command and what every verb shares; the layers own the
verbs. A layer keeps its verbs in one module, ``scriba.<layer>.shell``, that defines
``SHELL_VERBS``: a sequence of :class:`ShellVerb` (name, one-line help, the
arguments it adds, and ``run(args, metadata_uri) -> exit code``). :data:`VERB_MODULES`
lists those modules explicitly, lowest layer first, which is also the order
``scriba shell --help`` shows; a module that is not built or not installed yet is
skipped. The core finds them by name at run time, so it imports no layer, and no
layer has to import the layers above it to offer their verbs (tests/test_layers.py
checks both). A verb module imports heavy or optional dependencies (a Spark session,
say) inside its ``run``, so listing the verbs stays cheap and a missing extra breaks
only its own verbs.

What every verb gets: ``--metadata`` (else ``$SCRIBA_METADATA``, else the sandbox
running in ``./sandbox-data``) and ``--json``, accepted before or after the verb; one
deadline for the whole verb; failures raised as typed ``scriba.errors`` that the CLI
prints as one line (exit code 1). Two layers registering one verb name is a
programming error caught when the parser is built.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from scriba.errors import ConfigError
from scriba.invariant import invariant
from scriba.tls import TlsConfig
from scriba.tls_cli import add_tls_arguments, tls_from_args

ENV_METADATA = "SCRIBA_METADATA"
COMMAND_TIMEOUT_S = 300.0
# Where `scriba sandbox` keeps its data by default and describes itself while it runs.
SANDBOX_DIR_DEFAULT = "sandbox-data"
SANDBOX_FILE = "sandbox.json"

# One module per layer that has verbs, lowest layer first.
VERB_MODULES = (
    "scriba.client.shell",        # ledgers, bookies, placement, simple-test
    "scriba.stream.shell",
    "scriba.rsm.shell",
    "scriba.geo.shell",
    "scriba.autorecovery.shell",
    "scriba.pipeline.shell",
)

VerbRun = Callable[[argparse.Namespace, str], Awaitable[int]]


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A verb without arguments of its own."""


@dataclass(frozen=True, slots=True)
class ShellVerb:
    """One ``scriba shell`` verb: ``run(args, metadata_uri)`` returns the exit code."""

    name: str
    help: str
    run: VerbRun
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments


def import_if_present(name: str) -> ModuleType | None:
    """Import module ``name``; None when it (or the package holding it) does not exist.

    A module that exists but fails to import, or imports something missing, raises:
    a broken part must not look like a part that is not built yet.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


def load_verbs(modules: Sequence[str] = VERB_MODULES) -> list[ShellVerb]:
    """Every verb of every present module in ``modules``, in order; duplicates refused."""
    verbs: list[ShellVerb] = []
    owner: dict[str, str] = {}
    for name in modules:
        module = import_if_present(name)
        if module is None:
            continue
        for verb in getattr(module, "SHELL_VERBS", ()):
            invariant(isinstance(verb, ShellVerb), f"{name}.SHELL_VERBS holds {verb!r}, not a ShellVerb")
            invariant(verb.name not in owner,
                      f"shell verb {verb.name!r} registered by both {owner.get(verb.name)} and {name}")
            owner[verb.name] = name
            verbs.append(verb)
    return verbs


# --- the command --------------------------------------------------------------------


def register(subparsers: Any, modules: Sequence[str] = VERB_MODULES) -> None:
    """Add ``scriba shell`` with the verbs of every present layer."""
    verbs = load_verbs(modules)
    p = subparsers.add_parser("shell", help="operator commands (list, read, recover, simple-test, placement, ...)")
    p.add_argument("--metadata", default=None, help=f"metadata URI (default ${ENV_METADATA} or ./{SANDBOX_DIR_DEFAULT})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_tls_arguments(p, server=False)  # the client certificate the verbs dial bookies with
    sub = p.add_subparsers(dest="shell_command", metavar="COMMAND", required=True)
    for verb in verbs:
        sp = sub.add_parser(verb.name, help=verb.help)
        # accept --json / --metadata after the verb as well
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
        sp.add_argument("--metadata", default=argparse.SUPPRESS, help="metadata URI")
        verb.arguments(sp)
        sp.set_defaults(func=_runner(verb.run))


def _runner(func: VerbRun) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        uri = resolve_metadata(args.metadata)
        args.client_tls = resolve_client_tls(args, uri)
        result: int = asyncio.run(bounded(func(args, uri)))
        return result

    return run


async def bounded(coro: Awaitable[Any]) -> Any:
    """Await ``coro`` under the one deadline every shell verb has."""
    async with asyncio.timeout(COMMAND_TIMEOUT_S):
        return await coro


# --- what every verb shares ---------------------------------------------------------------


def resolve_metadata(uri: str | None, cwd: Path | None = None) -> str:
    """``--metadata``, else ``$SCRIBA_METADATA``, else ``./sandbox-data/sandbox.json``."""
    if uri:
        return uri
    env = os.environ.get(ENV_METADATA)
    if env:
        return env
    path = (cwd or Path.cwd()) / SANDBOX_DIR_DEFAULT / SANDBOX_FILE
    try:
        doc = json.loads(path.read_text())
        found: str = doc["metadata_uri"]
        return found
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"no metadata store given: pass --metadata URI, set {ENV_METADATA}, "
            f"or start `scriba sandbox` in this directory (no {path})"
        ) from None


def resolve_client_tls(args: argparse.Namespace, uri: str, cwd: Path | None = None) -> TlsConfig | None:
    """``--tls-*``, else the client certificate of the sandbox whose store ``uri`` is
    (``sandbox.json``'s ``client_tls``, written by ``scriba sandbox --tls``), else None."""
    flagged = tls_from_args(args)
    if flagged is not None:
        return flagged
    path = (cwd or Path.cwd()) / SANDBOX_DIR_DEFAULT / SANDBOX_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    section = doc.get("client_tls") if isinstance(doc, dict) and doc.get("metadata_uri") == uri else None
    if not isinstance(section, dict):
        return None
    cert, key, ca = (Path(section[k]) if section.get(k) else None for k in ("cert", "key", "ca"))
    return TlsConfig(cert=cert, key=key, ca=ca).validate()


def emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    """``doc`` as JSON with ``--json``, else ``text``."""
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(text)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as a plain-text table with upper-case headers, or ``(none)``."""
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)
