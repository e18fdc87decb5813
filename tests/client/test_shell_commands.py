"""``scriba shell`` against real bookies: listings, reads, errors, simple-test."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scriba.embedded.process import free_port
from scriba.errors import ConfigError
from scriba.shell import resolve_metadata

SCRIBA = [sys.executable, "-m", "scriba.cli", "--log-level", "error"]


def shell(uri: str | None, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = [*SCRIBA, "shell"] + (["--metadata", uri] if uri else [])
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=90, env=env, cwd=cwd)


def ok_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_line_error(done: subprocess.CompletedProcess[str], kind: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("scriba:")]
    assert len(lines) == 1 and kind in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_shell_commands_on_a_cluster(bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(3, zones=["zone-a", "zone-b", "zone-c"])
    uri = metadata_uri

    bookies = ok_json(shell(uri, "--json", "list-bookies"))
    assert sorted(b["bookie_id"] for b in bookies) == ["bookie-0", "bookie-1", "bookie-2"]
    assert {b["zone"] for b in bookies} == {"zone-a", "zone-b", "zone-c"}
    text = shell(uri, "list-bookies")
    assert text.returncode == 0 and "bookie-1" in text.stdout and "ADDRESS" in text.stdout

    report = ok_json(shell(uri, "simple-test", "--entries", "500", "--keep", "--json"))
    assert report["ok"] and report["written"] == report["read"] == 500 and report["mismatched"] == 0
    ledger_id = report["ledger_id"]

    ledgers = ok_json(shell(uri, "list-ledgers", "--json"))
    (row,) = [r for r in ledgers if r["ledger_id"] == ledger_id]
    assert row["state"] == "CLOSED" and row["last_entry_id"] == 499

    meta = ok_json(shell(uri, "ledger-metadata", str(ledger_id)))
    assert meta["ledger_id"] == ledger_id and meta["write_quorum_size"] == 3

    entries = ok_json(shell(uri, "--json", "read-ledger", str(ledger_id), "--from", "10", "--to", "12",
                            "--password", "scriba-simple-test"))
    assert [e["entry_id"] for e in entries] == [10, 11, 12]
    assert entries[0]["payload"].startswith("simple-test entry 10 ")

    one_line_error(shell(uri, "read-ledger", str(ledger_id), "--password", "wrong"), "UnauthorizedError")
    one_line_error(shell(uri, "ledger-metadata", "987654321"), "NoSuchLedgerError")
    one_line_error(shell(uri, "read-ledger", "987654321"), "NoSuchLedgerError")

    recovered = ok_json(shell(uri, "--json", "recover-ledger", str(ledger_id), "--password", "scriba-simple-test"))
    assert recovered["state"] == "CLOSED" and recovered["last_entry_id"] == 499

    abandoned = asyncio.run(_abandon_open_ledger(uri, entries=10))
    recovered = ok_json(shell(uri, "--json", "recover-ledger", str(abandoned), "--password", "pw"))
    assert recovered["state"] == "CLOSED" and recovered["last_entry_id"] == 9
    one_line_error(shell(uri, "recover-ledger", str(abandoned), "--password", "nope"), "UnauthorizedError")

    deleted = ok_json(shell(uri, "--json", "delete-ledger", str(ledger_id)))
    assert deleted["deleted"]
    assert ledger_id not in [r["ledger_id"] for r in ok_json(shell(uri, "list-ledgers", "--json"))]
    one_line_error(shell(uri, "delete-ledger", str(ledger_id)), "NoSuchLedgerError")

    # placement: what zone-aware would pick now, and a check of a zone-aware ledger
    explained = ok_json(shell(uri, "--json", "placement-explain", "--ensemble", "3", "--write", "3",
                              "--ack", "2", "--policy", "zone-aware"))
    assert explained["ok"] and explained["adherence"] == "MEETS_STRICT"
    assert {b["location"].split("/")[2] for b in explained["ensemble"]} == {"zone-a", "zone-b", "zone-c"}
    text = shell(uri, "placement-explain", "--policy", "zone-aware")
    assert text.returncode == 0 and "adherence: MEETS_STRICT" in text.stdout
    impossible = shell(uri, "--json", "placement-explain", "--ensemble", "5", "--write", "3", "--ack", "2")
    assert impossible.returncode == 1 and not json.loads(impossible.stdout)["ok"]
    zoned = asyncio.run(_create_zone_aware_ledger(uri))
    checked = ok_json(shell(uri, "--json", "placement-check", str(zoned)))
    assert checked[0]["policy"] == "zone-aware"
    assert [row["adherence"] for row in checked[0]["segments"]] == ["MEETS_STRICT"]
    every = ok_json(shell(uri, "--json", "placement-check", "--all"))
    assert zoned in [d["ledger_id"] for d in every]
    text = shell(uri, "placement-check", "--all")
    assert text.returncode == 0 and f"ledger {zoned}" in text.stdout and "MEETS_STRICT" in text.stdout
    one_line_error(shell(uri, "placement-check"), "ConfigError")


async def _abandon_open_ledger(uri: str, entries: int) -> int:
    """A ledger whose writer went away without closing it (recovery must close it)."""
    from scriba.client import Client

    async with Client.connect(uri) as client:
        writer = await client.create_ledger(3, 3, 2, password=b"pw")
        for i in range(entries):
            await writer.append(f"abandoned-{i}".encode())
        return int(writer.ledger_id)


async def _create_zone_aware_ledger(uri: str) -> int:
    from scriba.client import Client

    async with Client.connect(uri, placement="zone-aware") as client:
        writer = await client.create_ledger(3, 3, 2)
        await writer.append(b"zoned")
        await writer.close()
        return int(writer.ledger_id)


def test_shell_unreachable_store_is_one_line_error() -> None:
    done = shell(f"etcd://127.0.0.1:{free_port()}/nothing", "list-ledgers")
    one_line_error(done, "Error")


def test_shell_metadata_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCRIBA_METADATA", raising=False)
    with pytest.raises(ConfigError, match="--metadata"):
        resolve_metadata(None, cwd=tmp_path)
    (tmp_path / "sandbox-data").mkdir()
    (tmp_path / "sandbox-data" / "sandbox.json").write_text(json.dumps({"metadata_uri": "etcd://h:1/sb"}))
    assert resolve_metadata(None, cwd=tmp_path) == "etcd://h:1/sb"
    monkeypatch.setenv("SCRIBA_METADATA", "etcd://h:2/env")
    assert resolve_metadata(None, cwd=tmp_path) == "etcd://h:2/env"
    assert resolve_metadata("etcd://h:3/flag", cwd=tmp_path) == "etcd://h:3/flag"


def test_shell_without_metadata_says_how_to_fix(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SCRIBA_METADATA"}
    done = shell(None, "list-bookies", env=env, cwd=tmp_path)
    one_line_error(done, "ConfigError")
    assert "scriba sandbox" in done.stderr


# --- the verb registry (scriba.shell) ----------------------------------------------------------


def test_shell_finds_each_layers_verbs_by_name_and_skips_layers_not_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A layer above the client registers a verb through its own module; the client's verbs
    stay; a listed layer that does not exist yet is skipped."""
    import argparse

    from scriba.shell import VERB_MODULES, register

    pkg = tmp_path / "upperlayer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "shell.py").write_text(
        "from scriba.shell import ShellVerb\n"
        "seen = []\n"
        "async def run(args, uri):\n"
        "    seen.append((args.name, uri))\n"
        "    return 7\n"
        "def arguments(p):\n"
        "    p.add_argument('name')\n"
        "SHELL_VERBS = (ShellVerb('upper-verb', 'a verb of a layer above the client', run, arguments),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    parser = argparse.ArgumentParser(prog="scriba")
    register(parser.add_subparsers(dest="command"),
             modules=(*VERB_MODULES[:1], "upperlayer.shell", "scriba.notbuiltyet.shell"))
    args = parser.parse_args(["shell", "--metadata", "memory://verbs", "upper-verb", "it"])
    assert args.func(args) == 7
    import upperlayer.shell as upper  # type: ignore[import-not-found]

    assert upper.seen == [("it", "memory://verbs")]
    assert parser.parse_args(["shell", "list-bookies", "--json"]).json is True
    with pytest.raises(SystemExit):
        parser.parse_args(["shell", "--help"])
    help_text = capsys.readouterr().out
    assert "upper-verb" in help_text and "simple-test" in help_text
    assert help_text.index("simple-test") < help_text.index("upper-verb"), "lower layers list first"


def test_shell_refuses_a_verb_registered_twice_and_a_broken_verb_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scriba.invariant import InvariantViolation
    from scriba.shell import import_if_present, load_verbs

    (tmp_path / "twice.py").write_text(
        "from scriba.shell import ShellVerb\n"
        "async def run(args, uri):\n"
        "    return 0\n"
        "SHELL_VERBS = (ShellVerb('list-bookies', 'again', run),)\n"
    )
    (tmp_path / "broken.py").write_text("import scriba_dependency_that_is_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvariantViolation, match="list-bookies"):
        load_verbs(("scriba.client.shell", "twice"))
    assert import_if_present("scriba.notbuiltyet.shell") is None
    assert import_if_present("scriba.client.nosuchmodule") is None
    with pytest.raises(ModuleNotFoundError, match="scriba_dependency_that_is_missing"):
        load_verbs(("broken",))


@pytest.mark.parametrize("entries", ["0", "-5"])
def test_simple_test_refuses_zero_and_negative_entries_alike(entries: str) -> None:
    """Nothing is written (the store is not even reached): a test of no entries must not pass."""
    done = shell(f"etcd://127.0.0.1:{free_port()}/nothing", "simple-test", "--entries", entries)
    one_line_error(done, "ConfigError")
    assert f"--entries: must be at least 1, got {entries}" in done.stderr


def test_simple_test_options_checked_before_anything_happens() -> None:
    from scriba.client.shell import check_simple_test_options

    check_simple_test_options(ensemble=1, write=1, ack=1, entries=1, size=0)
    for name in ("ensemble", "write", "ack", "entries"):
        kw = {"ensemble": 3, "write": 3, "ack": 2, "entries": 10, "size": 10, name: 0}
        with pytest.raises(ConfigError, match=f"--{name}: must be at least 1, got 0"):
            check_simple_test_options(**kw)
    with pytest.raises(ConfigError, match="--size: must be at least 0, got -1"):
        check_simple_test_options(ensemble=3, write=3, ack=2, entries=1, size=-1)
    with pytest.raises(ConfigError, match="--entries"):
        asyncio.run(_simple_test_without_store())


async def _simple_test_without_store() -> None:
    from scriba.client.shell import simple_test

    await simple_test("memory://never-reached", entries=0)
