"""What the console shows, as JSON-ready dicts built from the mirror and the prober.

No I/O: every function reads the :class:`~scriba.console.mirror.Mirror`'s records and
the :class:`~scriba.console.probe.Prober`'s samples, both in memory. The JSON API
returns these dicts as they are and the HTML pages render them, so the two never
disagree. Decoded records are cached by (key, version).

A bookie's state: ``down`` when it is not registered or its last probe failed,
``read-only`` when registered read-only, else ``writable``. Bookies are the union of
cookies (every formatted bookie), registrations and probes; one that went keeps the
location it last registered with (:class:`Model` remembers it).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from scriba.autorecovery.records import (
    DECOMMISSION_PREFIX,
    UNDERREPLICATED_PREFIX,
    Decommission,
    UnderReplicated,
)
from scriba.console.decode_cache import MISS, DecodeCache
from scriba.console.geo_lag import GeoScraper
from scriba.console.mirror import ELECTIONS_PREFIX, RSM_PREFIX, Mirror
from scriba.console.probe import Prober, rates_between
from scriba.console.rsm_probe import RsmProber
from scriba.errors import BadRequestError, ConfigError, NoSuchLedgerError, ScribaError
from scriba.meta.records import (
    BOOKIES_PREFIX,
    COOKIES_PREFIX,
    LEDGERS_PREFIX,
    BookieMode,
    BookieRegistration,
    Cookie,
    LedgerMetadata,
    ledger_key,
)
from scriba.placement import BookieNode, Topology, make_policy
from scriba.placement import explain as placement_explain
from scriba.rsm.status import fill_lag
from scriba.stream.segments import STREAMS_PREFIX, CursorRecord, StreamRecord, namespace_from_token

T = TypeVar("T")

PAGE_SIZE_MAX: Final = 500
UNKNOWN: Final = "?"


@dataclass(frozen=True, slots=True)
class LedgerQuery:
    """``/api/ledgers`` parameters: a page of ledgers whose id or owner contains ``q``."""

    q: str = ""
    state: str = ""
    page: int = 1
    per_page: int = 50

    @classmethod
    def parse(cls, args: dict[str, str]) -> LedgerQuery:
        try:
            page = int(args.get("page", "1"))
            per_page = int(args.get("per_page", "50"))
        except ValueError:
            raise BadRequestError("page and per_page must be integers") from None
        if page < 1 or not 1 <= per_page <= PAGE_SIZE_MAX:
            raise BadRequestError(f"page must be >= 1 and per_page in [1, {PAGE_SIZE_MAX}]")
        state = args.get("state", "").upper()
        if state not in ("", "OPEN", "IN_RECOVERY", "CLOSED"):
            raise BadRequestError(f"state {state!r}: one of OPEN, IN_RECOVERY, CLOSED")
        return cls(args.get("q", "").strip(), state, page, per_page)


def parse_ledger_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadRequestError(f"ledger id {text!r}: not an integer") from None
    if not 0 <= value < 2**63:
        raise BadRequestError(f"ledger id {value}: out of range")
    return value


class Model:
    """The console's read model over one mirror and one prober."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.prober: Prober | None = None
        self.rsm_prober: RsmProber | None = None
        self.geo: GeoScraper | None = None
        self.decoded = DecodeCache()
        mirror.on_forget(self.decoded.forget)  # a key that goes takes its decodes along
        self._last_seen: dict[str, BookieRegistration] = {}  # bookie id -> last registration
        self._owners: tuple[int, dict[int, str]] = (-1, {})

    # --- decoding --------------------------------------------------------------
    def _decode(self, prefix: str, decode: Callable[[bytes], T]) -> Iterable[tuple[str, T]]:
        name = decode.__qualname__
        for key, (version, value) in self.mirror.records(prefix).items():
            hit = self.decoded.get(name, key, version)
            if hit is not MISS:
                yield key, hit
                continue
            try:
                record = decode(value)
            except (ScribaError, ValueError, TypeError):
                continue  # not a record of this kind (or malformed): not shown
            self.decoded.put(name, key, version, record)
            yield key, record

    def registrations(self) -> dict[str, BookieRegistration]:
        regs: dict[str, BookieRegistration] = {
            r.bookie_id: r for _, r in self._decode(BOOKIES_PREFIX, BookieRegistration.from_bytes)
        }
        self._last_seen.update(regs)
        return regs

    def probe_targets(self) -> dict[str, str]:
        """Bookie id -> http address of every registered bookie (the prober's targets)."""
        return {b: r.http_address for b, r in self.registrations().items()}

    # --- bookies and the map ---------------------------------------------------------
    def bookies(self) -> list[dict[str, Any]]:
        regs = self.registrations()
        cookies: dict[str, Cookie] = {c.bookie_id: c for _, c in self._decode(COOKIES_PREFIX, Cookie.from_bytes)}
        probes = self.prober.probes if self.prober is not None else {}
        drains: dict[str, str] = {
            d.bookie_id: d.state.value for _, d in self._decode(DECOMMISSION_PREFIX, Decommission.from_bytes)
        }
        rows = []
        for bookie_id in sorted(set(regs) | set(cookies) | set(probes)):
            reg = regs.get(bookie_id) or self._last_seen.get(bookie_id)
            probe = probes.get(bookie_id)
            registered = bookie_id in regs
            if not registered or (probe is not None and probe.failed):
                state = "down"
            elif reg is not None and reg.mode is BookieMode.READ_ONLY:
                state = "read-only"
            else:
                state = "writable"
            adds, reads = probe.rates() if probe is not None else (0.0, 0.0)
            free, total = (reg.free_bytes, reg.total_bytes) if reg is not None else (0, 0)
            if probe is not None and probe.samples and probe.samples[-1].total_bytes:
                free, total = int(probe.samples[-1].free_bytes), int(probe.samples[-1].total_bytes)
            cookie = cookies.get(bookie_id)
            rows.append({
                "bookie_id": bookie_id,
                "state": state,
                "registered": registered,
                "address": reg.address if reg else "",
                "http_address": reg.http_address if reg else "",
                "region": reg.region if reg else UNKNOWN,
                "zone": reg.zone if reg else UNKNOWN,
                "rack": reg.rack if reg else UNKNOWN,
                "version": reg.version if reg else "",
                "free_bytes": free,
                "total_bytes": total,
                "disk_used": round(1 - free / total, 4) if total else None,
                "adds_per_s": round(adds, 1),
                "reads_per_s": round(reads, 1),
                "instance_id": cookie.instance_id if cookie else "",
                "probe_error": probe.error if probe is not None else "",
                "decommission": drains.get(bookie_id, ""),  # DRAINING / DONE once one was started
            })
        return rows

    def bookie_history(self, bookie_id: str) -> list[dict[str, float]]:
        """The bookie's sample window: adds/s and reads/s between consecutive samples."""
        probe = self.prober.probes.get(bookie_id) if self.prober is not None else None
        if probe is None:
            return []
        out = []
        for a, b in itertools.pairwise(probe.samples):
            rates = rates_between(a, b)
            if rates is not None:
                out.append({"at_s": b.at_s, "adds_per_s": rates[0], "reads_per_s": rates[1]})
        return out

    def cluster(self) -> dict[str, Any]:
        """Regions -> zones -> racks -> bookies, sorted; and the counts by state."""
        tree: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
        bookies = self.bookies()
        for b in bookies:
            tree.setdefault(b["region"], {}).setdefault(b["zone"], {}).setdefault(b["rack"], []).append(b)
        regions = [{"region": r, "zones": [{"zone": z, "racks": [{"rack": k, "bookies": bs}
                                                                 for k, bs in sorted(racks.items())]}
                                           for z, racks in sorted(zones.items())]}
                   for r, zones in sorted(tree.items())]
        counts = {s: sum(1 for b in bookies if b["state"] == s) for s in ("writable", "read-only", "down")}
        return {"store": self.mirror.status(), "counts": counts, "regions": regions}

    def topology(self) -> Topology:
        return Topology.from_nodes(
            BookieNode(r.bookie_id, r.region, r.zone, r.rack, writable=r.writable, free_bytes=r.free_bytes)
            for r in self._last_seen.values()
        )

    # --- ledgers ---------------------------------------------------------------
    def owners(self) -> dict[int, str]:
        """Ledger id -> ``namespace/stream`` of the stream whose segment it is."""
        if self._owners[0] != self.mirror.changes:
            owners: dict[int, str] = {}
            for ns, stream in self._streams():
                for s in stream.segments:
                    owners[s.ledger_id] = f"{ns}/{stream.name}"
            self._owners = (self.mirror.changes, owners)
        return self._owners[1]

    def ledgers(self, query: LedgerQuery) -> dict[str, Any]:
        owners = self.owners()
        rows = []
        for _, m in sorted(self._decode(LEDGERS_PREFIX, LedgerMetadata.from_bytes), key=lambda kv: kv[0]):
            owner = owners.get(m.ledger_id, "")
            if query.q and query.q not in str(m.ledger_id) and query.q not in owner:
                continue
            if query.state and m.state.value != query.state:
                continue
            rows.append((m, owner))
        start = (query.page - 1) * query.per_page
        page = [{"ledger_id": int(m.ledger_id), "state": m.state.value, "ensemble_size": m.ensemble_size,
                 "write_quorum_size": m.write_quorum_size, "ack_quorum_size": m.ack_quorum_size,
                 "placement_policy": m.placement_policy, "length": m.length,
                 "last_entry_id": m.last_entry_id, "fragments": len(m.ensembles), "owner": owner}
                for m, owner in rows[start:start + query.per_page]]
        return {"total": len(rows), "page": query.page, "per_page": query.per_page,
                "pages": max(1, -(-len(rows) // query.per_page)), "q": query.q, "state": query.state,
                "ledgers": page}

    def ledger(self, ledger_id: int) -> dict[str, Any]:
        hit = self.mirror.records(LEDGERS_PREFIX).get(ledger_key(ledger_id))
        if hit is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        m = LedgerMetadata.from_bytes(hit[1])
        where = {b["bookie_id"]: b for b in self.bookies()}
        fragments = []
        for n, (first, ensemble) in enumerate(m.ensembles):
            last = m.ensembles[n + 1][0] - 1 if n + 1 < len(m.ensembles) else m.last_entry_id
            fragments.append({
                "first_entry_id": first, "last_entry_id": last,
                "bookies": [{"bookie_id": b, "zone": where.get(b, {}).get("zone", UNKNOWN),
                             "region": where.get(b, {}).get("region", UNKNOWN),
                             "rack": where.get(b, {}).get("rack", UNKNOWN),
                             "state": where.get(b, {}).get("state", "down")} for b in ensemble],
            })
        try:
            policy = make_policy(m.placement_policy, dict(m.placement_options))
            checks = placement_explain.check_ledger(policy, self.topology(), m.ensembles,
                                                    m.write_quorum_size, m.ack_quorum_size)
        except ConfigError as exc:
            checks = [{"error": str(exc)}]
        for fragment, check in zip(fragments, checks, strict=False):
            fragment["placement"] = {k: check.get(k) for k in ("adherence", "problems", "write_sets", "error")}
        doc = m.to_json()
        doc.pop("password_hash", None)
        doc.update(owner=self.owners().get(m.ledger_id, ""), fragments=fragments)
        return doc

    # --- streams ----------------------------------------------------------------
    def _streams(self) -> Iterable[tuple[str, StreamRecord]]:
        for key, record in self._decode(STREAMS_PREFIX, _stream_or_none):
            parts = key[len(STREAMS_PREFIX):].split("/")
            if record is not None and len(parts) == 2:
                yield namespace_from_token(parts[0]), record

    def streams(self) -> dict[str, Any]:
        cursors: dict[str, list[dict[str, Any]]] = {}
        for key, c in self._decode(STREAMS_PREFIX, _cursor_or_none):
            parts = key[len(STREAMS_PREFIX):].split("/")
            if c is not None and len(parts) == 4 and parts[2] == "cursors":
                cursors.setdefault(f"{namespace_from_token(parts[0])}/{parts[1]}", []).append(
                    {"name": c.name, "position": str(c.position), "updated_ms": c.updated_ms})
        namespaces: dict[str, list[dict[str, Any]]] = {}
        for ns, s in sorted(self._streams(), key=lambda x: (x[0], x[1].name)):
            full = f"{ns}/{s.name}"
            namespaces.setdefault(ns, []).append({
                "namespace": ns, "name": s.name, "state": s.state.value, "writer_epoch": s.writer_epoch,
                "truncated_before": str(s.truncated_before), "settings": dict(s.settings),
                "record_count": s.record_count, "size_bytes": s.size_bytes,
                "cursors": sorted(cursors.get(full, []), key=lambda c: c["name"]),
                "segments": [{"seq": g.seq, "ledger_id": g.ledger_id, "state": g.state.value,
                              "ctime_ms": g.ctime_ms, "closed_ms": g.closed_ms,
                              "first": str(g.first_position or g.start),
                              "last": str(g.last_position) if g.last_position else "",
                              "records": g.summary.record_count, "size_bytes": g.summary.size_bytes}
                             for g in s.segments],
            })
        return {"namespaces": [{"namespace": ns, "streams": rows} for ns, rows in sorted(namespaces.items())]}

    # --- RSM groups ------------------------------------------------------------
    def rsm_targets(self) -> dict[tuple[str, str], str]:
        """(group "NS/NAME", replica id) -> service address of every registered replica (the RSM prober's targets)."""
        return {(f"{g['namespace']}/{g['name']}", str(m.get("replica_id"))): str(m.get("address") or "")
                for g in self._registered_groups() for m in g["members"]}

    def rsm_groups(self) -> list[dict[str, Any]]:
        """Each group with its members: registration, overlaid with the replica's live STATUS when it
        answered (``answered``), lag behind the most advanced replica, last snapshot; and the leader."""
        probes = self.rsm_prober.probes if self.rsm_prober is not None else {}
        groups = self._registered_groups()
        for g in groups:
            rows = []
            for member in g["members"]:
                row = {"replica_id": member.get("replica_id"), "address": member.get("address", ""),
                       "zone": member.get("zone", ""), "role": member.get("role", ""),
                       "token": member.get("token"), "applied": member.get("applied") or "",
                       "lag_records": None, "lag_s": None, "snapshot_position": None, "snapshot_age_s": None,
                       "answered": False, "probe_error": ""}
                probe = probes.get((f"{g['namespace']}/{g['name']}", str(member.get("replica_id"))))
                if probe is not None and probe.status:
                    st = probe.status
                    row.update({k: st.get(k) for k in ("role", "token", "records_applied", "clock_ms",
                                                       "snapshot_position", "snapshot_age_s")},
                               applied=st.get("applied") or "", answered=True)
                elif probe is not None:
                    row["probe_error"] = probe.error
                rows.append(row)
            fill_lag(rows)
            g["members"] = rows
        return groups

    def _registered_groups(self) -> list[dict[str, Any]]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for key, (_, value) in self.mirror.records(RSM_PREFIX).items():
            parts = key[len(RSM_PREFIX):].split("/")
            if len(parts) == 3 and parts[1] == "members":
                try:
                    member = json.loads(value)
                except ValueError:
                    continue
                groups.setdefault(parts[0], []).append(member)
        out = []
        for group, members in sorted(groups.items()):
            ns_token, _, name = group.partition("~")
            leader = self._election_leader(f"rsm~{group}")
            out.append({"group": group, "namespace": namespace_from_token(ns_token), "name": name,
                        "leader": leader,
                        "members": sorted(members, key=lambda m: str(m.get("replica_id", "")))})
        return out

    def _election_leader(self, name: str) -> str | None:
        hit = self.mirror.records(ELECTIONS_PREFIX).get(f"{ELECTIONS_PREFIX}{name}/leader")
        if hit is None:
            return None
        try:
            return str(json.loads(hit[1])["candidate"])
        except (ValueError, KeyError, TypeError):
            return None

    # --- geo lag ------------------------------------------------------------------
    def geo_lag(self, now_s: float) -> dict[str, Any]:
        """Every geo link's lag samples over the window, and the replicator endpoints scraped."""
        if self.geo is None:
            return {"window_s": 0.0, "now_s": now_s, "endpoints": [], "links": []}
        return {"window_s": self.geo.window.window_s, "now_s": now_s,
                "endpoints": [{"address": e.address, "up": e.up, "error": e.error} for e in self.geo.endpoints],
                "links": self.geo.window.series()}

    # --- recovery ---------------------------------------------------------------
    def underreplicated(self) -> list[dict[str, Any]]:
        return [{"ledger_id": int(u.ledger_id), "bookies": list(u.bookies), "fragments": len(u.fragment_firsts),
                 "marks": [[m.first_entry_id, m.bookie_id, m.reason.value] for m in u.marks],
                 "attempts": u.attempts, "marked_ms": u.marked_ms, "last_error": u.last_error}
                for _, u in sorted(self._decode(UNDERREPLICATED_PREFIX, UnderReplicated.from_bytes),
                                   key=lambda kv: kv[0])]


def _stream_or_none(data: bytes) -> StreamRecord | None:
    try:
        return StreamRecord.from_bytes(data)
    except ScribaError:
        return None


def _cursor_or_none(data: bytes) -> CursorRecord | None:
    try:
        return CursorRecord.from_bytes(data)
    except ScribaError:
        return None
