"""The dependency arrows of ../shared/DESIGN.md, read from every library module's imports.

Every ``import`` and ``from ... import`` in every library module counts (module top
level, inside functions, under ``TYPE_CHECKING``: a lazy import is still an arrow).
Modules are grouped by where they live:

- layers, one per folder: ``placement``, ``meta``, ``bookie``, ``client`` and the
  folders still to come (``stream``, ``rsm``, ``geo``, ``autorecovery``, ``pipeline``,
  ``examples``, ``console``), covered as soon as they appear;
- ``core``: the shared core, ``scriba/`` itself (errors, config, ids, log, wire
  protocol, ``scriba.shell``, and ``scriba.cli``, which finds its command modules and
  ``scriba.shell`` the layers' verbs *by name* at run time, so neither has an arrow to
  a layer);
- ``entry``: ``scriba.sandbox``, ``scriba.demo`` and ``scriba.local_cluster``, commands
  that wire the layers together (the sandbox runs the client's simple-test). They may import any layer,
  and nothing imports them: the CLI reaches them by name;
- ``embedded``: ``scriba.embedded``, the launchers of etcd, ZooKeeper and bookie
  processes (a bookie is started as a process, never imported): core and meta only;
- ``testing``: ``scriba.testing``, the shipped test kit (launcher, faults, checkers,
  simulation). It stands above the library and may import any layer below the
  examples and the console; no library module imports it, except the one hook listed
  in :data:`EXCEPTIONS`.

A wrong arrow fails with the module, the line and the rule it breaks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from scriba.shell import VERB_MODULES

ROOT = Path(__file__).resolve().parents[1]

# folder -> the package it installs as (pyproject's package-dir)
LAYER_FOLDERS = ("meta", "placement", "bookie", "client", "stream", "rsm", "geo", "autorecovery",
                 "pipeline", "examples", "console")
FOLDERS = {"scriba": "scriba", **{f: f"scriba.{f}" for f in LAYER_FOLDERS}}

_LIBRARY = {"placement", "meta", "bookie", "client", "stream", "rsm", "geo", "autorecovery", "pipeline"}

# group -> the groups it may import (besides its own)
ALLOWED: Mapping[str, frozenset[str]] = {
    "core": frozenset(),
    "placement": frozenset({"core"}),
    "meta": frozenset({"core"}),
    "bookie": frozenset({"core", "meta"}),
    "client": frozenset({"core", "meta", "placement"}),
    "stream": frozenset({"core", "meta", "placement", "client"}),
    "rsm": frozenset({"core", "meta", "placement", "client", "stream"}),
    "geo": frozenset({"core", "meta", "placement", "client", "stream"}),
    "pipeline": frozenset({"core", "meta", "placement", "client", "stream", "autorecovery", "rsm"}),  # audit: the auditor's replica check at scale; compact: the RSM's apply and snapshot store
    "autorecovery": frozenset({"core", "meta", "placement", "client"}),
    "examples": frozenset({"core", "client", "stream", "rsm", "geo"}),  # the public API only (geo: the KV follower reads replication marks)
    "console": frozenset({"core", *_LIBRARY}),  # reads every layer, imported by none
    "embedded": frozenset({"core", "meta"}),
    "entry": frozenset({"core", "embedded", *_LIBRARY}),
    "testing": frozenset({"core", "embedded", *_LIBRARY}),
}

# (importing module, imported module) -> why this arrow is allowed
EXCEPTIONS: Mapping[tuple[str, str], str] = {
    ("scriba.bookie.fileio", "scriba.testing.diskfaults"):
        "a bookie started with SCRIBA_DISK_FAULTS loads the shipped disk-fault layer, lazily, only then",
}

ENTRY_MODULES = frozenset({"scriba.sandbox", "scriba.sandbox_cli", "scriba.demo", "scriba.local_cluster"})


def group_of(module: str) -> str | None:
    """The group of a module name; None outside ``scriba`` (the standard library, third parties)."""
    parts = module.split(".")
    if parts[0] != "scriba":
        return None
    if len(parts) == 1:
        return "core"
    second = parts[1]
    if second in LAYER_FOLDERS:
        return second
    if second in ("testing", "embedded"):
        return second
    if ".".join(parts[:2]) in ENTRY_MODULES:
        return "entry"
    return "core"


def module_name(folder: str, path: Path) -> str:
    rel = path.relative_to(ROOT / folder).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([FOLDERS[folder], *parts])


def library_sources() -> dict[str, tuple[str, bool]]:
    """module name -> (source, is a package's __init__) for every library module in the repository."""
    out: dict[str, tuple[str, bool]] = {}
    for folder in FOLDERS:
        base = ROOT / folder
        if not base.is_dir():
            continue  # a layer not built yet
        for path in sorted(base.rglob("*.py")):
            if "_pb2" in path.name:
                continue  # generated protobuf code
            out[module_name(folder, path)] = (path.read_text(), path.name == "__init__.py")
    return out


def imports_of(module: str, source: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in ``source``, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                # `from scriba import client` imports the client layer, not the core
                yield node.lineno, f"{base}.{alias.name}" if base == "scriba" else base


def wrong_arrows(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Every import that breaks a rule, as ``module:line imports target: why``."""
    problems: list[str] = []
    for module, (source, is_package) in sorted(sources.items()):
        group = group_of(module)
        if group is None:
            continue
        for line, target in imports_of(module, source, is_package=is_package):
            to = group_of(target)
            if to is None or to == group:
                continue
            if (module, target) in EXCEPTIONS:
                continue
            if to not in ALLOWED[group]:
                problems.append(f"{module}:{line} imports {target}: {group} may not import {to} "
                                f"(allowed: {', '.join(sorted(ALLOWED[group])) or 'nothing outside itself'})")
    return problems


# --- the rules hold in the repository -------------------------------------------------------


def test_every_library_module_keeps_the_dependency_arrows() -> None:
    sources = library_sources()
    assert {"scriba.cli", "scriba.shell", "scriba.placement.base", "scriba.client.shell",
            "scriba.bookie.server", "scriba.meta.store"} <= set(sources), "the scan found the library"
    problems = wrong_arrows(sources)
    assert not problems, "wrong dependency arrows:\n" + "\n".join(problems)


def test_every_layers_shell_verbs_are_found_by_the_shell() -> None:
    """A ``<layer>/shell.py`` that defines SHELL_VERBS is listed in scriba.shell.VERB_MODULES,
    and every listed module names a layer folder."""
    for name in VERB_MODULES:
        parts = name.split(".")
        assert len(parts) == 3 and parts[0] == "scriba" and parts[1] in LAYER_FOLDERS and parts[2] == "shell", name
    for folder in LAYER_FOLDERS:
        path = ROOT / folder / "shell.py"
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        defines = any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "SHELL_VERBS" for t in n.targets)
                      for n in tree.body)
        if defines:
            assert f"scriba.{folder}.shell" in VERB_MODULES, f"{folder}/shell.py defines verbs nobody loads"


def test_exceptions_still_exist() -> None:
    """An exception whose import is gone must be removed, so the list cannot grow stale."""
    sources = library_sources()
    for module, target in EXCEPTIONS:
        assert module in sources, module
        source, is_package = sources[module]
        assert target in {t for _, t in imports_of(module, source, is_package=is_package)}, (module, target)


# --- negative controls: the checker finds wrong arrows ----------------------------------------


@pytest.mark.parametrize(
    ("module", "source", "needle"),
    [
        ("scriba.placement.fake", "import scriba.client\n", "placement may not import client"),
        ("scriba.placement.fake", "def f():\n    from scriba.meta.records import X\n", "placement may not import meta"),
        ("scriba.meta.fake", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scriba.client import Client\n",
         "meta may not import client"),
        ("scriba.bookie.fake", "from scriba.client.write_core import WriteCore\n", "bookie may not import client"),
        ("scriba.client.fake", "from scriba import stream\n", "client may not import stream"),
        ("scriba.client.fake", "import scriba.console.app\n", "client may not import console"),
        ("scriba.stream.fake", "from scriba.rsm import machine\n", "stream may not import rsm"),
        ("scriba.rsm.fake", "from scriba.geo import replicator\n", "rsm may not import geo"),
        ("scriba.examples.kv", "from scriba.meta.store import MetadataStore\n", "examples may not import meta"),
        ("scriba.errors", "from scriba.client.shell import SHELL_VERBS\n", "core may not import client"),
        ("scriba.shell", "from scriba.sandbox import DEFAULT_DATA_DIR\n", "core may not import entry"),
        ("scriba.client.fake", "from scriba.testing.history import History\n", "client may not import testing"),
        ("scriba.embedded.fake", "from scriba.client import Client\n", "embedded may not import client"),
    ],
)
def test_checker_reports_a_wrong_arrow(module: str, source: str, needle: str) -> None:
    problems = wrong_arrows({module: (source, False)})
    assert len(problems) == 1 and needle in problems[0], problems


def test_checker_resolves_relative_imports() -> None:
    wrong = wrong_arrows({"scriba.placement.fake": ("from ..client import shell\n", False)})
    assert len(wrong) == 1 and "imports scriba.client" in wrong[0], wrong
    inside = wrong_arrows({"scriba.placement": ("from .topology import Topology\nfrom . import spread\n", True)})
    assert inside == []


def test_checker_accepts_the_arrows_the_design_draws() -> None:
    good = {
        "scriba.placement.fake": ("from scriba.errors import ConfigError\nimport networkx\n", False),
        "scriba.client.fake": ("from scriba.meta.records import X\nfrom scriba.placement import make_policy\n", False),
        "scriba.bookie.fake": ("from scriba.meta.store import MetadataStore\n", False),
        "scriba.stream.fake": ("from scriba.client import Client\n", False),
        "scriba.rsm.fake": ("from scriba.stream import x\n", False),
        "scriba.sandbox": ("def f():\n    from scriba.client.shell import simple_test_report\n", False),
        "scriba.testing.fake": ("from scriba.client.write_core import WriteCore\n", False),
        "scriba.console.fake": ("import scriba.geo\nimport scriba.rsm\n", False),
    }
    assert wrong_arrows(good) == []
