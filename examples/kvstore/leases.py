"""The lease table: TTLs and deadlines on the proposers' clocks, no clock of its own.

A grant or keep-alive carries the proposing server's wall clock (``now_ms``); the
lease's deadline is ``now_ms + ttl * 1000``. Nothing expires here by itself: the
leader's server asks which deadlines have passed on its clock and proposes
``LEASE_EXPIRE(id, deadline)``, applied only if the lease still has that deadline
(a keep-alive applied in between wins). So every replica revokes the same lease at
the same log position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scriba.examples.kvstore import errors

FIRST_LEASE_ID = 0x7E57_0000_0000_0001


@dataclass(slots=True)
class Lease:
    lease_id: int
    granted_ttl_s: int
    ttl_s: int
    deadline_ms: int
    keys: set[bytes] = field(default_factory=set)

    def remaining_s(self, now_ms: int) -> int:
        return max(0, (self.deadline_ms - now_ms) // 1000)


class LeaseTable:
    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        self.next_id = FIRST_LEASE_ID

    def grant(self, lease_id: int, ttl_s: int, now_ms: int) -> Lease:
        if ttl_s > errors.LEASE_TTL_MAX_S:
            raise errors.LEASE_TTL_TOO_LARGE
        if lease_id == 0:
            while self.next_id in self.leases:
                self.next_id += 1
            lease_id = self.next_id
            self.next_id += 1
        elif lease_id in self.leases:
            raise errors.LEASE_EXISTS
        ttl_s = max(ttl_s, errors.LEASE_TTL_MIN_S)
        lease = Lease(lease_id, ttl_s, ttl_s, now_ms + ttl_s * 1000)
        self.leases[lease_id] = lease
        return lease

    def get(self, lease_id: int) -> Lease:
        lease = self.leases.get(lease_id)
        if lease is None:
            raise errors.LEASE_NOT_FOUND
        return lease

    def renew(self, lease_id: int, now_ms: int) -> int:
        """The TTL after a keep-alive (0: no such lease, as etcd answers)."""
        lease = self.leases.get(lease_id)
        if lease is None:
            return 0
        lease.deadline_ms = now_ms + lease.ttl_s * 1000
        return lease.ttl_s

    def attach(self, key: bytes, old: int, new: int) -> None:
        if old and old in self.leases:
            self.leases[old].keys.discard(key)
        if new:
            self.leases[new].keys.add(key)

    def expired(self, now_ms: int) -> list[Lease]:
        return sorted((x for x in self.leases.values() if x.deadline_ms <= now_ms), key=lambda x: x.lease_id)
