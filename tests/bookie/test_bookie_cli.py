"""`scriba bookie run|format`: argument handling, config validation, and operations errors
(a port in use, a dir that is a file) reported in one line by a real process."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from itertools import chain
from pathlib import Path

import pytest

from scriba.bookie.cli import build_config, register
from scriba.bookie.config import BookieConfig
from scriba.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bookie", *argv])


def test_run_arguments_become_a_validated_config(tmp_path: Path) -> None:
    args = parse("run", "--metadata", "etcd://127.0.0.1:2379/x", "--data", str(tmp_path / "d"),
                 "--journal", str(tmp_path / "j"), "--listen", "0.0.0.0:4181", "--region", "eu",
                 "--zone", "eu-1", "--rack", "r3", "--http", "127.0.0.1:8001",
                 "--storage-option", "journal_group_wait_ms_max=0.5", "--storage-option", "checkpoint_interval_s=2")
    config = build_config(args)
    assert config.resolved_bookie_id == "127.0.0.1:4181"  # the id defaults to the address
    assert (config.region, config.zone, config.rack) == ("eu", "eu-1", "r3")
    assert (config.http_host, config.http_port) == ("127.0.0.1", 8001)
    assert config.storage_options == {"journal_group_wait_ms_max": 0.5, "checkpoint_interval_s": 2}
    assert config.cookie_dirs == (tmp_path / "d", tmp_path / "j")
    assert config.storage_journal_dir == tmp_path / "j" / "journal"
    assert config.grpc_message_bytes_max > config.entry_size_max


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"listen_port": 70000}, "listen_port"),
        ({"zone": "a/b"}, "zone"),
        ({"entry_size_max": 10}, "entry_size_max"),
        ({"inflight_bytes_per_connection_max": 1024}, "inflight_bytes_per_connection_max"),
        ({"bookie_id": ""}, "bookie_id"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        BookieConfig(metadata_uri="memory://x", data_dir=tmp_path, **change).validate()  # type: ignore[arg-type]


def test_storage_option_needs_key_and_value(tmp_path: Path) -> None:
    args = parse("run", "--metadata", "memory://x", "--data", str(tmp_path), "--listen", "127.0.0.1:1",
                 "--storage-option", "oops")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        build_config(args)


# --- operations errors on a real process: one clear line, non-zero exit -------------------

ENTRY_POINTS = {"scriba": ["scriba.cli", "bookie"], "scriba-bookie": ["scriba.bookie.cli"]}


def run_cli(entry: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *ENTRY_POINTS[entry], *argv, "--metadata", "memory://cli"],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *names: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("scriba: ConfigError: ")
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_listen_on_a_port_in_use_says_so_in_one_line(tmp_path: Path, entry: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = run_cli(entry, "run", "--listen", address, "--data", str(tmp_path / "d"), cwd=tmp_path)
    line = assert_one_clear_line(result, address)
    assert "in use" in line
    assert not (tmp_path / "d").exists()  # refused before any work (no cookie, no journal)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("flag", ["--data", "--journal"])
def test_a_data_or_journal_dir_that_is_a_file_says_so_in_one_line(tmp_path: Path, entry: str, flag: str) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    dirs = {"--data": str(tmp_path / "d"), "--journal": str(tmp_path / "j"), flag: str(file)}
    result = run_cli(entry, "run", "--listen", "127.0.0.1:0", *chain.from_iterable(dirs.items()), cwd=tmp_path)
    assert "not a directory" in assert_one_clear_line(result, str(file))
    assert file.read_text() == "not a directory"


def test_format_on_a_data_path_below_a_file_says_so_in_one_line(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    result = run_cli("scriba-bookie", "format", "--id", "b1", "--data", str(file / "sub"), cwd=tmp_path)
    assert f"{file} is a file" in assert_one_clear_line(result, str(file / "sub"))


async def test_a_port_taken_after_the_check_is_still_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scriba.bookie import server
    from scriba.bookie.memory_storage import InMemoryLedgerStorage

    async def memory(config: object) -> InMemoryLedgerStorage:
        return InMemoryLedgerStorage()

    monkeypatch.setattr(server, "check_listen", lambda host, port: None)  # lose the race
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = BookieConfig(metadata_uri="memory://cli-race", data_dir=tmp_path / "d",
                              listen_host="127.0.0.1", listen_port=port)
        bookie = server.Bookie(config, storage_factory=memory)
        with pytest.raises(ConfigError, match=f"listen 127.0.0.1:{port}: cannot bind"):
            await bookie.start()
