"""``scriba sandbox --regions 3 --zones-per-region 2``: a 3-region topology on this machine (#16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scriba.errors import ConfigError
from scriba.sandbox import SandboxOptions

SCRIBA = [sys.executable, "-m", "scriba.cli"]


def test_locations_fill_every_zone_of_every_region_round_robin() -> None:
    options = SandboxOptions(Path("x"), bookies=6, zones=2, regions=3)
    assert [options.location(i) for i in range(7)] == [
        ("region-1", "zone-a"), ("region-2", "zone-a"), ("region-3", "zone-a"),
        ("region-1", "zone-b"), ("region-2", "zone-b"), ("region-3", "zone-b"), ("region-1", "zone-a"),
    ]
    single = SandboxOptions(Path("x"), bookies=4, zones=3)  # one region: as before
    assert [single.location(i) for i in range(4)] == [("region-1", z) for z in ("zone-a", "zone-b", "zone-c", "zone-a")]
    with pytest.raises(ConfigError, match="--regions"):
        SandboxOptions(Path("x"), regions=0).validate()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sandbox_three_regions_two_zones_each(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--regions", "3", "--zones-per-region", "2",
                              "--detach"], capture_output=True, text=True, timeout=150)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        doc = json.loads((data / "sandbox.json").read_text())
        places = sorted((b["region"], b["zone"]) for b in doc["bookies"])
        assert places == sorted((f"region-{r}", z) for r in (1, 2, 3) for z in ("zone-a", "zone-b"))
        assert doc["regions"] == ["region-1", "region-2", "region-3"]
        listed = subprocess.run([*SCRIBA, "shell", "--metadata", doc["metadata_uri"], "--json", "list-bookies"],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        registered = {b["bookie_id"]: b["region"] for b in json.loads(listed.stdout)}
        assert registered == {b["bookie_id"]: b["region"] for b in doc["bookies"]}  # the store has the topology
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--stop"], capture_output=True, text=True,
                                 timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_inter_region_latency_needs_two_regions() -> None:
    with pytest.raises(ConfigError, match="--regions 2 or more"):
        SandboxOptions(Path("x"), regions=1, inter_region_latency_ms=5).validate()
    with pytest.raises(ConfigError, match=">= 0"):
        SandboxOptions(Path("x"), regions=2, inter_region_latency_ms=-1).validate()


def _round_trip_s(address: str) -> float:
    import time

    import grpc

    from scriba.proto import scriba_pb2 as pb
    from scriba.proto import scriba_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BookieStub(channel)
        stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=30)  # connect first
        t0 = time.monotonic()
        stub.GetBookieInfo(pb.BookieInfoRequest(), timeout=30)
        return time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sandbox_inter_region_latency_through_the_fault_proxy(tmp_path: Path) -> None:
    """Bookies outside region-1 are reached through a latency proxy: each round trip to
    them takes at least twice the injected latency (a lower bound, not a timing goal)."""
    data = tmp_path / "sb"
    latency_ms = 40
    started = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--regions", "2", "--zones-per-region", "1",
                              "--bookies", "3",
                              "--inter-region-latency-ms", str(latency_ms), "--no-console", "--detach"],
                             capture_output=True, text=True, timeout=150)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        doc = json.loads((data / "sandbox.json").read_text())
        assert doc["region_latency"]["latency_ms"] == latency_ms
        listed = subprocess.run([*SCRIBA, "shell", "--metadata", doc["metadata_uri"], "--json", "list-bookies"],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        registered = {b["bookie_id"]: (b["region"], b["address"]) for b in json.loads(listed.stdout)}
        assert {r for r, _ in registered.values()} == {"region-1", "region-2"}
        for bookie_id, (region, address) in registered.items():
            if region == "region-1":
                assert address.startswith("127.0.0.1:"), address
            else:
                assert doc["region_latency"]["proxies"][bookie_id] == address
                assert _round_trip_s(address) >= 2 * latency_ms / 1000 * 0.9
        simple = subprocess.run([*SCRIBA, "shell", "--metadata", doc["metadata_uri"], "simple-test"],
                                capture_output=True, text=True, timeout=120)
        assert simple.returncode == 0, simple.stdout + simple.stderr
    finally:
        stopped = subprocess.run([*SCRIBA, "sandbox", "--data", str(data), "--stop"], capture_output=True, text=True,
                                 timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
