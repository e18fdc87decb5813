"""Placement unit tests: load spread, read order, messages, options, topology files, explain."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from placement_oracle import STRICT, expected_adherence, uniform_topology

from scriba.errors import ConfigError, NotEnoughBookiesError
from scriba.ids import BookieId
from scriba.placement import (
    Adherence,
    BookieNode,
    Location,
    Topology,
    load_topology_file,
    make_policy,
    parse_topology_mapping,
    read_order,
)
from scriba.placement.explain import (
    check_ledger,
    explain_new_ensemble,
    format_check_text,
    format_explain_text,
)

# --- load spread --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "sizes"), [
    ("random", (3, 2, 2)),
    ("rack-aware", (3, 2, 2)),
    ("zone-aware", (3, 3, 2)),
    ("region-aware", (4, 4, 3)),
])
def test_ten_thousand_ledgers_spread_within_twenty_percent(name: str, sizes: tuple[int, int, int]) -> None:
    topology = uniform_topology(regions=3, zones=2, racks=2, bookies=2)  # 24 bookies
    policy = make_policy(name, rng=random.Random(1234))
    counts: Counter[str] = Counter()
    e, w, a = sizes
    for _ in range(10_000):
        result = policy.new_ensemble(topology, e, w, a)
        counts.update(result.bookies)
    mean = 10_000 * e / len(topology)
    assert set(counts) == set(topology.nodes)
    worst = max(abs(c - mean) / mean for c in counts.values())
    assert worst <= 0.20, f"{name}: worst deviation {worst:.1%} from mean {mean:.0f}"


def test_free_space_weights_the_choice() -> None:
    nodes = [BookieNode.at(f"small{i}", "/r/z/k", free_bytes=100) for i in range(5)]
    nodes += [BookieNode.at(f"big{i}", "/r/z/k", free_bytes=200) for i in range(5)]
    topology = Topology.from_nodes(nodes)
    policy = make_policy("random", rng=random.Random(5))
    counts: Counter[str] = Counter()
    for _ in range(4000):
        counts.update(policy.new_ensemble(topology, 1, 1, 1).bookies)
    big = sum(c for b, c in counts.items() if b.startswith("big"))
    small = sum(c for b, c in counts.items() if b.startswith("small"))
    assert 1.7 < big / small < 2.3, (big, small)
    uniform = make_policy("random", {"weighted": False}, rng=random.Random(5))
    counts.clear()
    for _ in range(4000):
        counts.update(uniform.new_ensemble(topology, 1, 1, 1).bookies)
    big = sum(c for b, c in counts.items() if b.startswith("big"))
    assert 0.85 < big / (4000 - big) < 1.15


# --- failures name the constraint and the counts --------------------------------------


def test_zone_shortage_message_names_constraint_and_counts() -> None:
    topology = Topology.from_nodes([
        BookieNode.at("a1", "/r/zone-a/k1"),
        BookieNode.at("a2", "/r/zone-a/k2"),
        BookieNode.at("a3", "/r/zone-a/k3"),
        BookieNode.at("b1", "/r/zone-b/k1", writable=False),
    ])
    policy = make_policy("zone-aware", rng=random.Random(1))
    with pytest.raises(NotEnoughBookiesError) as info:
        policy.new_ensemble(topology, 3, 3, 2)
    msg = str(info.value)
    assert "needs 2 zones" in msg and "/r/zone-a" in msg and "1 of 4 bookies read-only" in msg, msg


def test_not_enough_bookies_at_all() -> None:
    topology = uniform_topology(1, 1, 1, 2)
    with pytest.raises(NotEnoughBookiesError, match="ensemble of 3 needs 3 bookies, only 1 eligible"):
        make_policy("random").new_ensemble(topology, 3, 2, 2, exclude={"r0z0k0b0"})


def test_region_aware_refuses_an_impossible_configuration() -> None:
    topology = uniform_topology(3, 1, 1, 3)
    policy = make_policy("region-aware", rng=random.Random(1))
    with pytest.raises(ConfigError, match=r"impossible configuration.*ack_quorum_size 2"):
        policy.new_ensemble(topology, 3, 3, 2)
    result = policy.new_ensemble(topology, 3, 3, 3)
    assert len({topology.location(b).region for b in result.bookies}) >= 2
    three = make_policy("region-aware", {"min_regions_for_durability": 3})
    with pytest.raises(ConfigError):
        three.new_ensemble(topology, 6, 6, 4)   # 4 <= 6 - 2
    assert three.new_ensemble(topology, 6, 6, 5).adherence is not Adherence.FAIL


def test_rack_aware_degrades_unless_enforced() -> None:
    topology = uniform_topology(1, 1, 1, 5)  # one rack
    loose = make_policy("rack-aware", rng=random.Random(1))
    result = loose.new_ensemble(topology, 3, 2, 2)
    assert result.adherence is Adherence.FAIL
    assert any("degraded" in r for r in result.reasons)
    strict = make_policy("rack-aware", {"enforce": True}, rng=random.Random(1))
    with pytest.raises(NotEnoughBookiesError, match="needs 2 racks"):
        strict.new_ensemble(topology, 3, 2, 2)


def test_rack_aware_replacement_prefers_the_failed_bookies_rack() -> None:
    topology = uniform_topology(1, 1, 4, 3)
    policy = make_policy("rack-aware", {"enforce": True}, rng=random.Random(3))
    ensemble = policy.new_ensemble(topology, 3, 2, 2).bookies
    for i in range(3):
        result = policy.replace_bookie(topology, ensemble, i, 2, 2, exclude={ensemble[i]})
        assert topology.location(result.bookies[i]) == topology.location(ensemble[i])
        assert any("own domain" in r for r in result.reasons)
    # the whole rack gone: another rack that keeps two racks per write set
    gone = {b for b in topology.nodes if topology.location(b) == topology.location(ensemble[0])}
    result = policy.replace_bookie(topology, ensemble, 0, 2, 2, exclude=gone)
    assert result.bookies[0] not in gone
    assert expected_adherence("rack-aware", {"enforce": True}, topology, result.bookies, 2, 2) == STRICT
    # with E=3, W=2 every position shares a write set with both others: losing two
    # racks leaves no rack that keeps the constraint, and enforce says so
    racks = {topology.location(b) for b in ensemble}
    spare = {b for b in topology.nodes if topology.location(b) not in racks}
    with pytest.raises(NotEnoughBookiesError, match="cannot replace"):
        policy.replace_bookie(topology, ensemble, 0, 2, 2, exclude=gone | spare)


def test_zone_aware_replacement_when_a_zone_is_lost() -> None:
    topology = uniform_topology(1, 4, 1, 2)  # zones z0..z3
    policy = make_policy("zone-aware", rng=random.Random(9))
    ensemble = policy.new_ensemble(topology, 3, 3, 2).bookies
    lost_zone = topology.location(ensemble[1]).zone
    gone = {b for b in topology.nodes if topology.location(b).zone == lost_zone}
    result = policy.replace_bookie(topology, ensemble, 1, 3, 2, exclude=gone)
    zones = {topology.location(b).zone for b in result.bookies}
    assert lost_zone not in zones and len(zones) == 3
    assert result.adherence is Adherence.MEETS_STRICT


def _replacement_case(zones_of_spares: dict[str, int]) -> Topology:
    """Ensemble bookies e0..e3 in zones z0, z1, z1, z2 (one rack each), spares per zone."""
    nodes = [BookieNode.at(f"e{i}", f"/r0/{z}/k{i}") for i, z in enumerate(["z0", "z1", "z1", "z2"])]
    for zone, n in zones_of_spares.items():
        nodes += [BookieNode.at(f"{zone}-spare{j}", f"/r0/{zone}/spare{j}", free_bytes=40 if zone == "z1" else 10)
                  for j in range(n)]
    return Topology.from_nodes(nodes)


def test_zone_aware_replacement_never_stacks_three_replicas_in_one_zone() -> None:
    """E=W=4, Qa=3, zones [z0, z1, z1, z2]; the z0 bookie fails and z0 has no spare. Either
    replacement spans two zones, but one from z1 puts three of four replicas in z1 (losing
    z1 then leaves one copy of entries three bookies acknowledged); one from z2 leaves two
    and two. z1 has more spares and more free space, so a tie would mostly pick z1."""
    topology = _replacement_case({"z1": 4, "z2": 1})
    ensemble = ("e0", "e1", "e2", "e3")
    for seed in range(200):
        policy = make_policy("zone-aware", rng=random.Random(seed))
        result = policy.replace_bookie(topology, ensemble, 0, 4, 3, exclude={"e0"})
        assert result.bookies == ("z2-spare0", "e1", "e2", "e3"), (seed, result)
        assert result.adherence is Adherence.MEETS_SOFT


def test_zone_aware_replacement_spreads_racks_inside_the_zone_it_must_reuse() -> None:
    """E=W=3 over zones z0, z1, z2; the z0 bookie fails and z0 has no spare; the spares are
    all in z1, so the rack decides: not the rack that already holds a replica."""
    nodes = [BookieNode.at("e0", "/r0/z0/k0"), BookieNode.at("e1", "/r0/z1/k1"), BookieNode.at("e2", "/r0/z2/k2"),
             *(BookieNode.at(f"same-rack{j}", "/r0/z1/k1", free_bytes=40) for j in range(4)),
             BookieNode.at("new-rack", "/r0/z1/k9", free_bytes=10)]
    topology = Topology.from_nodes(nodes)
    for seed in range(100):
        policy = make_policy("zone-aware", rng=random.Random(seed))
        result = policy.replace_bookie(topology, ("e0", "e1", "e2"), 0, 3, 2, exclude={"e0"})
        assert result.bookies[0] == "new-rack", (seed, result)


def test_unknown_policy_and_bad_options() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        make_policy("nearest")
    with pytest.raises(ConfigError, match="unknown option"):
        make_policy("zone-aware", {"min_zones": 2})
    with pytest.raises(ConfigError, match="whole number"):
        make_policy("rack-aware", {"min_racks_per_write_quorum": 0})
    with pytest.raises(ConfigError, match="true or false"):
        make_policy("rack-aware", {"enforce": "maybe"})
    with pytest.raises(ConfigError, match="below min_zones"):
        make_policy("zone-aware", {"desired_zones_per_write_quorum": 1})
    p = make_policy("zone_aware", {"min-zones-per-write-quorum": "2", "strict": "false"})
    assert p.name == "zone-aware" and p.options["strict"] is False
    assert p.options["min_zones_per_write_quorum"] == 2
    with pytest.raises(ConfigError, match="ensemble_size >= write_quorum_size"):
        make_policy().new_ensemble(uniform_topology(1, 1, 1, 3), 2, 3, 2)


# --- read order ------------------------------------------------------------------------


def test_read_order_local_rack_zone_region_remote_then_read_only_then_failed() -> None:
    nodes = [
        BookieNode.at("remote", "/r2/z1/k1"),
        BookieNode.at("region", "/r1/z2/k1"),
        BookieNode.at("zone", "/r1/z1/k2"),
        BookieNode.at("rack", "/r1/z1/k1"),
        BookieNode.at("ro-rack", "/r1/z1/k1", writable=False),
        BookieNode.at("failed-rack", "/r1/z1/k1"),
    ]
    topology = Topology.from_nodes(nodes)
    write_set = [BookieId(n.bookie_id) for n in nodes] + [BookieId("gone")]
    order = read_order(topology, write_set, local="/r1/z1/k1", failed={"failed-rack"})
    assert order == ["rack", "zone", "region", "remote", "ro-rack", "gone", "failed-rack"]
    # without a location: the write-set order, read-only and failed last
    plain = make_policy("zone-aware").read_order(topology, write_set, failed={"remote"})
    assert plain == ["region", "zone", "rack", "failed-rack", "ro-rack", "gone", "remote"]


# --- topology ------------------------------------------------------------------------


def test_topology_tree_and_indexes() -> None:
    topology = uniform_topology(2, 2, 2, 1)
    g = topology.graph
    assert g.out_degree("/") == 2
    assert topology.children("/") == ["/r0", "/r1"]
    assert topology.children("/r0") == ["/r0/z0", "/r0/z1"]
    assert len(topology.bookies_under("/r1")) == 4
    assert len(topology.racks) == 8
    ro = topology.with_node(BookieNode.at("r0z0k0b0", "/r0/z0/k0", writable=False))
    assert "r0z0k0b0" not in ro.writable and "r0z0k0b0" in topology.writable
    assert len(ro.without(BookieId("r0z0k0b0"))) == 7
    with pytest.raises(ConfigError, match="twice"):
        Topology.from_nodes([BookieNode.at("x", "/a/b/c"), BookieNode.at("x", "/a/b/d")])


def test_location_parsing() -> None:
    assert Location.parse("/eu/eu-1a/r7") == Location("eu", "eu-1a", "r7")
    assert Location.parse("/z/k") == Location("default-region", "z", "k")
    assert Location.parse("/k").path == "/default-region/default-zone/k"
    for bad in ("eu/a/b", "/a//b", "/a/b/c/d", ""):
        with pytest.raises(ConfigError):
            Location.parse(bad)


def test_topology_files_yaml_and_json(tmp_path: Path) -> None:
    y = tmp_path / "topo.yaml"
    y.write_text("bookies:\n  bk1: /eu/a/r1\n  127.0.0.1:3181: {region: us, zone: b, rack: r2}\n")
    got = load_topology_file(y)
    assert got == {"bk1": Location("eu", "a", "r1"), "127.0.0.1:3181": Location("us", "b", "r2")}
    j = tmp_path / "topo.json"
    j.write_text(json.dumps({"bk2": "/ap/c/r3"}))
    assert load_topology_file(j) == {"bk2": Location("ap", "c", "r3")}
    with pytest.raises(ConfigError):
        parse_topology_mapping("- just\n- a list\n")
    with pytest.raises(ConfigError):
        load_topology_file(tmp_path / "missing.yaml")


def test_from_registrations_uses_file_then_registration_then_default() -> None:
    class Reg:
        def __init__(self, bid: str, addr: str, region: str = "default-region",
                     zone: str = "default-zone", rack: str = "default-rack") -> None:
            self.bookie_id, self.address = bid, addr
            self.region, self.zone, self.rack = region, zone, rack
            self.writable, self.free_bytes = True, 5

    files = {"127.0.0.1:1": Location("eu", "a", "r1")}
    topology = Topology.from_registrations(
        [Reg("b1", "127.0.0.1:1"), Reg("b2", "127.0.0.1:2", "us", "b", "r"), Reg("b3", "x:3")],
        files)
    assert topology.location(BookieId("b1")).path == "/eu/a/r1"
    assert topology.location(BookieId("b2")).path == "/us/b/r"
    assert topology.location(BookieId("b3")).path == "/default-region/default-zone/default-rack"


# --- explain / check -----------------------------------------------------------------


def test_explain_new_ensemble_json_and_text() -> None:
    topology = uniform_topology(1, 3, 2, 2)
    policy = make_policy("zone-aware", rng=random.Random(2))
    doc = explain_new_ensemble(policy, topology, 3, 3, 2)
    json.dumps(doc)
    assert doc["ok"] and doc["adherence"] == "MEETS_STRICT"
    assert len(doc["ensemble"]) == 3 and all(ws["zones"] == 3 for ws in doc["write_sets"])
    assert doc["reasons"] and "zone" in " ".join(doc["reasons"])
    text = format_explain_text(doc)
    assert "MEETS_STRICT" in text and "why:" in text
    bad = explain_new_ensemble(policy, uniform_topology(1, 1, 2, 2), 3, 3, 2)
    assert not bad["ok"] and "needs 2 zones" in bad["error"]
    assert "cannot place" in format_explain_text(bad)


def test_check_ledger_reports_each_segment() -> None:
    topology = uniform_topology(1, 3, 1, 3)
    policy = make_policy("zone-aware")
    good = (BookieId("r0z0k0b0"), BookieId("r0z1k0b0"), BookieId("r0z2k0b0"))
    soft = (BookieId("r0z0k0b0"), BookieId("r0z0k0b1"), BookieId("gone"))
    bad = (BookieId("r0z0k0b0"), BookieId("r0z0k0b1"), BookieId("r0z0k0b2"))
    rows = check_ledger(policy, topology, [(0, good), (10, soft), (20, bad)], 3, 2)
    json.dumps(rows)
    assert [r["adherence"] for r in rows] == ["MEETS_STRICT", "MEETS_SOFT", "FAIL"]
    assert [r["first_entry_id"] for r in rows] == [0, 10, 20]
    assert rows[0]["problems"] == []
    assert any("desired 3" in p for p in rows[1]["problems"])
    assert any("not in the topology" in p for p in rows[1]["problems"])
    assert any("needs 2" in p for p in rows[2]["problems"])
    text = format_check_text(7, rows)
    assert "ledger 7 segment 2 (from entry 20): FAIL" in text
    plain = check_ledger(policy, topology, [good], 3, 2)
    assert plain[0]["adherence"] == "MEETS_STRICT"
