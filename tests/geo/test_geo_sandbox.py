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
