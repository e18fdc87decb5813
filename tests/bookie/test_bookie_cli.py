"""`scriba bookie run|format` argument handling and config validation."""

from __future__ import annotations

import argparse
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
