"""Hypothesis properties of every placement policy over random topologies.

The oracle (``placement_oracle``) recomputes each constraint for every round-robin
write set independently of the policies. Sized for CI (< 60 s for tests/placement);
``SCRIBA_SOAK=1`` runs many more examples.
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from placement_oracle import (
    FAIL,
    STRICT,
    constraint_level,
    domain,
    enforced,
    expected_adherence,
)

from scriba.errors import ConfigError, NotEnoughBookiesError
from scriba.placement import BookieNode, Topology, make_policy, read_order

SOAK = os.environ.get("SCRIBA_SOAK") == "1"
PROFILE = settings(
    max_examples=2000 if SOAK else 120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not SOAK,
)
RANKS = {"FAIL": 0, "MEETS_SOFT": 1, "MEETS_STRICT": 2}
POLICY_NAMES = ["random", "rack-aware", "zone-aware", "region-aware"]


@st.composite
def topologies(draw: st.DrawFn) -> tuple[Topology, frozenset[str]]:
    """1-5 regions, 1-6 zones, 1-8 racks, 0-50 bookies; random read-only and failed sets."""
    n_regions = draw(st.integers(1, 5))
    n_zones = draw(st.integers(1, 6))
    n_racks = draw(st.integers(1, 8))
    zone_region = [i % n_regions if i < n_regions else draw(st.integers(0, n_regions - 1))
                   for i in range(n_zones)]
    rack_zone = [i % n_zones if i < n_zones else draw(st.integers(0, n_zones - 1))
                 for i in range(n_racks)]
    n_bookies = draw(st.integers(0, 50))
    racks = draw(st.lists(st.integers(0, n_racks - 1), min_size=n_bookies, max_size=n_bookies))
    read_only = draw(st.lists(st.booleans(), min_size=n_bookies, max_size=n_bookies))
    failed = draw(st.lists(st.integers(0, 9), min_size=n_bookies, max_size=n_bookies))
    nodes = []
    for i, k in enumerate(racks):
        z = rack_zone[k]
        nodes.append(BookieNode.at(f"b{i}", f"/r{zone_region[z]}/z{z}/k{k}",
                                   writable=not (read_only[i] and failed[i] < 4),
                                   free_bytes=draw(st.sampled_from([0, 10, 20, 40]))))
    excluded = frozenset(f"b{i}" for i, f in enumerate(failed) if f == 0)
    return Topology.from_nodes(nodes), excluded


@st.composite
def policies(draw: st.DrawFn) -> tuple[str, dict[str, Any], int, int, int]:
    name = draw(st.sampled_from(POLICY_NAMES))
    e = draw(st.integers(1, 7))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    opts: dict[str, Any] = {}
    if name == "rack-aware":
        opts = {"min_racks_per_write_quorum": draw(st.integers(1, 4)), "enforce": draw(st.booleans())}
    elif name == "zone-aware":
        zmin = draw(st.integers(1, 3))
        opts = {"min_zones_per_write_quorum": zmin,
                "desired_zones_per_write_quorum": draw(st.integers(zmin, 4)),
                "strict": draw(st.booleans())}
    elif name == "region-aware":
        r = draw(st.integers(1, 3))
        opts = {"min_regions_for_durability": r, "enforce_durability": draw(st.booleans())}
    if draw(st.booleans()):
        opts["weighted"] = False
    return name, opts, e, w, a


def region_config_impossible(name: str, opts: dict[str, Any], w: int, a: int) -> bool:
    if name != "region-aware" or not opts.get("enforce_durability", True):
        return False
    r = opts.get("min_regions_for_durability", 2)
    return a <= w - w // r


def eligible(topology: Topology, excluded: frozenset[str]) -> list[str]:
    return sorted(b for b, n in topology.nodes.items() if n.writable and b not in excluded)


@PROFILE
@given(topologies(), policies(), st.integers(0, 2**32 - 1))
def test_new_ensemble_meets_constraint_on_every_write_set_or_raises(topo, pol, seed) -> None:
    topology, excluded = topo
    name, opts, e, w, a = pol
    policy = make_policy(name, opts, rng=random.Random(seed))
    if region_config_impossible(name, opts, w, a):
        with pytest.raises(ConfigError, match="impossible configuration"):
            policy.new_ensemble(topology, e, w, a, exclude=excluded)
        return
    try:
        result = policy.new_ensemble(topology, e, w, a, exclude=excluded)
    except NotEnoughBookiesError as exc:
        msg = str(exc)
        assert name in msg and "read-only" in msg, msg
        ok = eligible(topology, excluded)
        level = constraint_level(name)
        if len(ok) >= e and level is not None:
            # a complete search succeeds when the domains are there for a trivial
            # arrangement: one domain per position
            assert len({domain(topology, b, level) for b in ok}) < e, msg
            assert "needs" in msg, msg
        else:
            assert len(ok) < e or enforced(name, opts), msg
        return
    bookies = result.bookies
    assert len(bookies) == e and len(set(bookies)) == e
    for b in bookies:
        assert b not in excluded, f"excluded {b} chosen"
        assert topology.nodes[b].writable, f"read-only {b} chosen"
    got = expected_adherence(name, opts, topology, bookies, w, a)
    assert RANKS[result.adherence.value] == got, (result, got)
    if enforced(name, opts):
        assert got != FAIL, result
    assert result.reasons, "a placement must say why"


@PROFILE
@given(topologies(), policies(), st.integers(0, 2**32 - 1), st.data())
def test_replace_bookie_never_picks_bad_bookies_and_is_as_good_as_achievable(
        topo, pol, seed, data) -> None:
    topology, excluded = topo
    name, opts, e, w, a = pol
    assume(not region_config_impossible(name, opts, w, a))
    everyone = sorted(topology.nodes)
    assume(len(everyone) >= e)
    ensemble = data.draw(st.permutations(everyone).map(lambda p: tuple(p[:e])))
    index = data.draw(st.integers(0, e - 1))
    exclude = excluded | {ensemble[index]}
    policy = make_policy(name, opts, rng=random.Random(seed))
    candidates = [b for b in eligible(topology, frozenset(exclude)) if b not in ensemble]

    def with_(b: str) -> tuple[str, ...]:
        return (*ensemble[:index], b, *ensemble[index + 1:])

    achievable = max((expected_adherence(name, opts, topology, with_(b), w, a) for b in candidates),
                     default=None)
    try:
        result = policy.replace_bookie(topology, ensemble, index, w, a, exclude=exclude)
    except NotEnoughBookiesError as exc:
        assert achievable is None or (enforced(name, opts) and achievable == FAIL), (exc, achievable)
        return
    new = result.bookies
    assert len(new) == e
    assert new[:index] == ensemble[:index] and new[index + 1:] == ensemble[index + 1:]
    chosen = new[index]
    assert chosen not in exclude and chosen not in ensemble
    assert topology.nodes[chosen].writable
    got = expected_adherence(name, opts, topology, new, w, a)
    assert got == achievable, (result, got, achievable)
    assert RANKS[result.adherence.value] == got


@PROFILE
@given(st.sampled_from(["rack-aware", "zone-aware", "region-aware"]), st.integers(1, 4),
       st.integers(1, 3), st.integers(0, 2**32 - 1), st.data())
def test_new_ensemble_is_strict_when_a_periodic_layout_exists(name, w, k, seed, data) -> None:
    """E = k*W and W domains with k free bookies each: the policy must find a strict layout."""
    e = k * w
    extra = data.draw(st.integers(0, 3))
    level = constraint_level(name)
    n_domains = w + extra
    nodes = []
    for d in range(n_domains):
        if level == 0:
            loc = f"/r{d}/z{d % 2}/k0"
        elif level == 1:
            loc = f"/r0/z{d}/k{d % 2}"
        else:
            loc = f"/r0/z0/k{d}"
        size = k if d < w else data.draw(st.integers(0, k))
        nodes += [BookieNode.at(f"d{d}b{i}", loc) for i in range(size)]
    topology = Topology.from_nodes(nodes)
    opts: dict[str, Any] = {}
    a = w
    if name == "region-aware":
        opts = {"min_regions_for_durability": min(2, w)}
    if name == "zone-aware":
        opts = {"min_zones_per_write_quorum": min(2, w), "desired_zones_per_write_quorum": w}
    if name == "rack-aware":
        opts = {"min_racks_per_write_quorum": w, "enforce": True}
    policy = make_policy(name, opts, rng=random.Random(seed))
    result = policy.new_ensemble(topology, e, w, a)
    assert expected_adherence(name, opts, topology, result.bookies, w, a) == STRICT, result
    for ws in range(e):
        doms = {domain(topology, result.bookies[(ws + i) % e], level) for i in range(w)}  # type: ignore[arg-type]
        assert len(doms) == w, (ws, result)


@PROFILE
@given(topologies(), st.integers(0, 2**32 - 1), st.sampled_from([(2, 2), (3, 3), (4, 2), (6, 3)]))
def test_zone_aware_never_doubles_a_zone_while_another_zone_has_a_free_bookie(topo, seed, sizes) -> None:
    """With E a multiple of W (BookKeeper's strict rule), a write set repeats a zone only
    if every zone it misses has no free eligible bookie."""
    topology, excluded = topo
    e, w = sizes
    policy = make_policy("zone-aware", {"desired_zones_per_write_quorum": w},
                         rng=random.Random(seed))
    try:
        result = policy.new_ensemble(topology, e, w, 2, exclude=excluded)
    except NotEnoughBookiesError:
        return
    ens = result.bookies
    used = set(ens)
    free_zones = {(n.region, n.zone) for b, n in topology.nodes.items()
                  if n.writable and b not in excluded and b not in used}
    for start in range(e):
        ws = [ens[(start + i) % e] for i in range(w)]
        zones = {(topology.nodes[b].region, topology.nodes[b].zone) for b in ws}
        if len(zones) < w:
            assert not (free_zones - zones), (ens, start, free_zones - zones)


@st.composite
def zoned_topologies(draw: st.DrawFn) -> tuple[Topology, frozenset[str]]:
    """One or two regions, 2-5 zones, 2-10 racks, 4-24 bookies, a few read-only or failed:
    crowded enough that replacements have to choose between zones and racks already used."""
    n_regions = draw(st.integers(1, 2))
    n_zones = draw(st.integers(2, 5))
    n_racks = draw(st.integers(2, 10))
    rack_zone = [i % n_zones if i < n_zones else draw(st.integers(0, n_zones - 1)) for i in range(n_racks)]
    n_bookies = draw(st.integers(4, 24))
    nodes = []
    for i in range(n_bookies):
        k = draw(st.integers(0, n_racks - 1))
        z = rack_zone[k]
        nodes.append(BookieNode.at(f"b{i}", f"/r{z % n_regions}/z{z}/k{k}", writable=draw(st.integers(0, 9)) > 0,
                                   free_bytes=draw(st.sampled_from([0, 10, 40]))))
    excluded = frozenset(f"b{i}" for i in range(n_bookies) if draw(st.integers(0, 9)) == 0)
    return Topology.from_nodes(nodes), excluded


@PROFILE
@given(st.one_of(topologies(), zoned_topologies()), st.integers(2, 5), st.integers(0, 2**32 - 1), st.data())
def test_zone_aware_replacement_shares_a_zone_and_rack_with_as_few_replicas_as_any_candidate(
        topo, e, seed, data) -> None:
    """E = W: the replacement shares its zone with as few of the other replicas as any
    candidate would (so the largest number of replicas in one zone is as small as any
    candidate can make it), and among candidates sharing a zone with equally few, shares
    its rack with as few as any."""
    topology, excluded = topo
    everyone = sorted(topology.nodes)
    assume(len(everyone) > e)
    ensemble = data.draw(st.permutations(everyone).map(lambda p: tuple(p[:e])))
    index = data.draw(st.integers(0, e - 1))
    zmin = data.draw(st.integers(1, 3))
    opts = {"min_zones_per_write_quorum": zmin,
            "desired_zones_per_write_quorum": data.draw(st.integers(zmin, 4)),
            "strict": data.draw(st.booleans())}
    exclude = excluded | {ensemble[index]}
    candidates = [b for b in eligible(topology, frozenset(exclude)) if b not in ensemble]
    others = [b for i, b in enumerate(ensemble) if i != index]

    def zone(b: str) -> tuple[str, str]:
        return domain(topology, b, 1)  # type: ignore[return-value]

    def rack(b: str) -> tuple[str, str, str]:
        return domain(topology, b, 2)  # type: ignore[return-value]

    def shared(b: str) -> tuple[int, int]:
        return sum(zone(o) == zone(b) for o in others), sum(rack(o) == rack(b) for o in others)

    def most_in_one_zone(b: str) -> int:
        return max(Counter(zone(x) for x in (*others, b)).values())

    policy = make_policy("zone-aware", opts, rng=random.Random(seed))
    try:
        result = policy.replace_bookie(topology, ensemble, index, e, min(2, e), exclude=exclude)
    except NotEnoughBookiesError:
        assert not candidates or opts["strict"]
        return
    chosen = result.bookies[index]
    assert shared(chosen) == min(shared(b) for b in candidates), (ensemble, index, chosen)
    assert most_in_one_zone(chosen) == min(most_in_one_zone(b) for b in candidates)


@PROFILE
@given(topologies(), st.data())
def test_read_order_is_a_permutation_ordered_by_health_then_distance(topo, data) -> None:
    topology, failed = topo
    everyone = [*sorted(topology.nodes), "unregistered"]
    write_set = data.draw(st.lists(st.sampled_from(everyone), min_size=1, max_size=6, unique=True))
    local = data.draw(st.sampled_from([None, "/r0/z0/k0", "/r1/z1/k1"]))
    order = read_order(topology, write_set, local=local, failed=failed)
    assert sorted(order) == sorted(write_set)

    def rank(b: str) -> tuple[int, int, int]:
        node = topology.nodes.get(b)  # type: ignore[call-overload]
        health = 2 if node is None else (0 if node.writable else 1)
        if local is None:
            near = 0
        elif node is None:
            near = 3
        else:
            r, z, k = local.strip("/").split("/")
            near = (0 if (node.region, node.zone, node.rack) == (r, z, k) else
                    1 if (node.region, node.zone) == (r, z) else 2 if node.region == r else 3)
        return (int(b in failed), health, near)

    ranks = [rank(b) for b in order]
    assert ranks == sorted(ranks), list(zip(order, ranks, strict=True))
    for a, b in itertools.pairwise(order):
        if rank(a) == rank(b):
            assert write_set.index(a) < write_set.index(b), "ties keep write-set order"


def test_policies_are_reproducible_with_the_same_seed() -> None:
    rng = random.Random(7)
    topology = Topology.from_nodes(
        BookieNode.at(f"b{i}", f"/r{rng.randrange(3)}/z{rng.randrange(3)}/k{rng.randrange(4)}")
        for i in range(60)
    )
    for name in POLICY_NAMES:
        a = make_policy(name, rng=random.Random(42))
        b = make_policy(name, rng=random.Random(42))
        ra = [a.new_ensemble(topology, 4, 4, 3).bookies for _ in range(20)]
        rb = [b.new_ensemble(topology, 4, 4, 3).bookies for _ in range(20)]
        assert ra == rb
        assert len(set(ra)) > 1, "different calls should differ"
