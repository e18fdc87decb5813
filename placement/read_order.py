"""The order in which to try the bookies of a write set for a read.

Order: bookies that have not recently failed before those that have; among them
writable before read-only before unregistered; then by distance from ``local``
(same rack, same zone, same region, remote); ties keep the write-set order (the
first is the entry's primary). ``local`` is a location string ``/region/zone/rack``.
Pure function: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from scriba.ids import BookieId
from scriba.placement.topology import Location, Topology


def distance(a: Location, b: Location) -> int:
    """0 same rack, 1 same zone, 2 same region, 3 another region."""
    if a.region != b.region:
        return 3
    if a.zone != b.zone:
        return 2
    if a.rack != b.rack:
        return 1
    return 0


def read_order(topology: Topology, write_set: Sequence[BookieId], *, local: str | None = None,
               failed: Collection[BookieId] = ()) -> list[BookieId]:
    here = Location.parse(local) if local else None
    bad = set(failed)

    def key(item: tuple[int, BookieId]) -> tuple[int, int, int, int]:
        index, bookie = item
        node = topology.nodes.get(bookie)
        health = 2 if node is None else (0 if node.writable else 1)
        near = distance(here, node.location) if here is not None and node is not None else 0
        if here is not None and node is None:
            near = 3
        return (1 if bookie in bad else 0, health, near, index)

    return [b for _, b in sorted(enumerate(write_set), key=key)]
