"""``scriba bench``: runs against real bookies and reports throughput and latency."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from scriba.client.bench import BenchConfig, percentile
from scriba.errors import ConfigError


def test_percentile_and_config_validation() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 0.5) == 500.0
    assert percentile(values, 0.99) == 990.0
    assert percentile(values, 0.999) == 999.0
    assert percentile([], 0.5) == 0.0
    with pytest.raises(ConfigError):
        BenchConfig("memory://x", ensemble_size=2, write_quorum_size=3).validate()
    with pytest.raises(ConfigError):
        BenchConfig("memory://x", inflight=0).validate()
    with pytest.raises(ConfigError):
        BenchConfig("memory://x", entries=None, seconds=None).validate()


@pytest.mark.slow
def test_bench_reports_json(bookie_cluster: Any, metadata_uri: str) -> None:
    bookie_cluster.start_bookies(3)
    done = subprocess.run(
        [sys.executable, "-m", "scriba.cli", "--log-level", "warning", "bench", "--metadata", metadata_uri,
         "--entries", "3000", "--inflight", "200", "--ledgers", "2", "--size", "512", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["entries"] == 3000 and result["failed"] == 0
    assert result["entries_per_s"] > 0 and result["mb_per_s"] > 0
    assert 0 < result["latency_ms_p50"] <= result["latency_ms_p99"] <= result["latency_ms_p999"] <= result["latency_ms_max"]
    assert result["ledgers"] == 2 and result["size_bytes"] == 512
    assert result["adds_per_message"] > 1  # adds to one bookie travel batched
    text = subprocess.run(
        [sys.executable, "-m", "scriba.cli", "--log-level", "warning", "bench", "--metadata", metadata_uri,
         "--seconds", "2.5", "--inflight", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert text.returncode == 0, text.stderr
    assert "entries/s" in text.stdout and "p99.9" in text.stdout
    assert "bench:" in text.stderr  # progress while it runs
