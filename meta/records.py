"""Records kept in the metadata store, and where they live.

Records are frozen dataclasses serialised as JSON with an explicit ``format``
version (readable by ``scriba shell`` and by people). Derive a changed record
with ``dataclasses.replace`` and write it through ``update_metadata``.

Key layout (relative to the store's root)::

    ledgers/<ledger id, 20 digits>      LedgerMetadata
    bookies/available/<bookie id>       BookieRegistration (ephemeral)
    bookies/cookies/<bookie id>         Cookie
    ids/<sequence>                      id allocator state
    elections/<name>/leader             leader election
"""

from __future__ import annotations

import enum
import json
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from scriba.entry import ENTRY_SIZE_MAX_DEFAULT
from scriba.errors import BadRequestError
from scriba.ids import INVALID_ENTRY_ID, BookieId, EntryId, LedgerId
from scriba.invariant import invariant
from scriba.quorum import Quorum, SlotRegions

FORMAT_VERSION = 1

LEDGERS_PREFIX = "ledgers/"
BOOKIES_PREFIX = "bookies/available/"
COOKIES_PREFIX = "bookies/cookies/"
LEDGER_ID_SEQUENCE = "ledger"


def ledger_key(ledger_id: int) -> str:
    return f"{LEDGERS_PREFIX}{ledger_id:020d}"


def ledger_id_from_key(key: str) -> LedgerId:
    return LedgerId(int(key.rsplit("/", 1)[-1]))


def bookie_key(bookie_id: str) -> str:
    return f"{BOOKIES_PREFIX}{bookie_id}"


def cookie_key(bookie_id: str) -> str:
    return f"{COOKIES_PREFIX}{bookie_id}"


def load_record(data: bytes, kind: str) -> dict[str, Any]:
    """The JSON body of a record of ``kind`` (``BadRequestError`` if it is not one, or is newer)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"{kind}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise BadRequestError(f"{kind}: record of another kind")
    if doc.get("format", 0) > FORMAT_VERSION:
        raise BadRequestError(f"{kind}: format {doc.get('format')} is newer than this build")
    return doc


def _positive_int(value: Any) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return value


def dump_record(kind: str, body: dict[str, Any]) -> bytes:
    """A record of ``kind``: ``body`` as JSON with its kind and format version."""
    return json.dumps({"kind": kind, "format": FORMAT_VERSION, **body}, sort_keys=True).encode()


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class DigestType(enum.Enum):
    CRC32C = "crc32c"
    HMAC_SHA256 = "hmac-sha256"


Ensemble = tuple[BookieId, ...]


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """A ledger: its quorums, state, and the ensembles that hold its entries.

    ``ensembles`` is a tuple of ``(first_entry_id, ensemble)`` sorted by first entry:
    the ensemble in force from that entry until the next segment's first entry.

    ``min_regions_for_durability > 1`` (the synchronous geo mode) makes the ack rule
    count regions (``Quorum.regions_min``); ``bookie_regions`` then records the region
    of each bookie of its ensembles when it joined, so the writer and every recoverer
    count with the same map even after a whole region's registrations are gone (a
    bookie missing from it counts toward no region).
    """

    KIND: ClassVar[str] = "ledger"

    ledger_id: LedgerId
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    ensembles: tuple[tuple[EntryId, Ensemble], ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: EntryId = INVALID_ENTRY_ID
    length: int = 0
    digest_type: DigestType = DigestType.CRC32C
    password_hash: bytes = b""
    ctime_ms: int = 0
    custom_metadata: Mapping[str, str] = field(default_factory=dict)
    placement_policy: str = "random"
    placement_options: Mapping[str, Any] = field(default_factory=dict)
    # The password itself, kept as BookKeeper keeps it (LedgerMetadataFormat.password,
    # read by its admin opens and autorecovery) so that replication workers can re-replicate
    # a ledger without being told its password. None: not stored (a client configured
    # not to, or a record older than the field); workers then need it from their config.
    # Whoever can read ledger metadata can read it: protect the store (etcd auth, ZK ACLs).
    password: bytes | None = None
    min_regions_for_durability: int = 1
    bookie_regions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        invariant(
            self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1,
            f"ledger {self.ledger_id}: need ensemble >= write quorum >= ack quorum >= 1",
        )
        invariant(
            1 <= self.min_regions_for_durability <= self.ack_quorum_size,
            f"ledger {self.ledger_id}: min_regions_for_durability "
            f"{self.min_regions_for_durability} must be between 1 and the ack quorum",
        )
        invariant(bool(self.ensembles), f"ledger {self.ledger_id}: no ensemble")
        invariant(
            all(len(e) == self.ensemble_size for _, e in self.ensembles),
            f"ledger {self.ledger_id}: ensemble of the wrong size",
        )

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def segment_index(self, entry_id: int) -> int:
        firsts = [first for first, _ in self.ensembles]
        return max(bisect_right(firsts, entry_id) - 1, 0)

    def ensemble_at(self, entry_id: int) -> Ensemble:
        """The ensemble that holds ``entry_id``."""
        return self.ensembles[self.segment_index(entry_id)][1]

    @property
    def current_ensemble(self) -> Ensemble:
        return self.ensembles[-1][1]

    @property
    def quorum(self) -> Quorum:
        """The ledger's quorum rules (write sets, acks, fencing): ``scriba.quorum``."""
        return Quorum(
            self.ensemble_size, self.write_quorum_size, self.ack_quorum_size,
            self.min_regions_for_durability,
        )

    def slot_regions(self, ensemble: Ensemble, *, unknown_distinct: bool = False) -> SlotRegions | None:
        """The region bits of ``ensemble``'s slots, or None when regions do not count
        (``unknown_distinct``: see ``SlotRegions``; bookies missing from
        ``bookie_regions``, e.g. placed by autorecovery, have an unknown region)."""
        if self.min_regions_for_durability == 1:
            return None
        regions = self.bookie_regions
        return SlotRegions.of([regions.get(b) for b in ensemble], unknown_distinct=unknown_distinct)

    def write_set(self, entry_id: int) -> Ensemble:
        """The bookies that hold ``entry_id``, in write order (``Quorum.write_set``)."""
        ensemble = self.ensemble_at(entry_id)
        return tuple(ensemble[slot] for slot in self.quorum.write_set(entry_id))

    def bookies(self) -> set[BookieId]:
        return {b for _, ensemble in self.ensembles for b in ensemble}

    # --- codec ---------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return dump_record(
            self.KIND,
            {
                "ledger_id": self.ledger_id,
                "ensemble_size": self.ensemble_size,
                "write_quorum_size": self.write_quorum_size,
                "ack_quorum_size": self.ack_quorum_size,
                "ensembles": [[first, list(e)] for first, e in self.ensembles],
                "state": self.state.value,
                "last_entry_id": self.last_entry_id,
                "length": self.length,
                "digest_type": self.digest_type.value,
                "password_hash": self.password_hash.hex(),
                "ctime_ms": self.ctime_ms,
                "custom_metadata": dict(self.custom_metadata),
                "placement_policy": self.placement_policy,
                "placement_options": dict(self.placement_options),
                **({} if self.password is None else {"password": self.password.hex()}),
                # written only when set, so records of other ledgers keep their bytes
                **(
                    {
                        "min_regions_for_durability": self.min_regions_for_durability,
                        "bookie_regions": dict(self.bookie_regions),
                    }
                    if self.min_regions_for_durability > 1 or self.bookie_regions
                    else {}
                ),
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerMetadata:
        d = load_record(data, cls.KIND)
        try:
            return cls(
                ledger_id=LedgerId(d["ledger_id"]),
                ensemble_size=d["ensemble_size"],
                write_quorum_size=d["write_quorum_size"],
                ack_quorum_size=d["ack_quorum_size"],
                ensembles=tuple(
                    (EntryId(first), tuple(BookieId(b) for b in e)) for first, e in d["ensembles"]
                ),
                state=LedgerState(d["state"]),
                last_entry_id=EntryId(d["last_entry_id"]),
                length=d["length"],
                digest_type=DigestType(d["digest_type"]),
                password_hash=bytes.fromhex(d["password_hash"]),
                ctime_ms=d["ctime_ms"],
                custom_metadata=d.get("custom_metadata", {}),
                placement_policy=d.get("placement_policy", "random"),
                placement_options=d.get("placement_options", {}),
                password=None if d.get("password") is None else bytes.fromhex(d["password"]),
                min_regions_for_durability=d.get("min_regions_for_durability", 1),
                bookie_regions=d.get("bookie_regions", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequestError(f"ledger metadata: malformed ({exc!r})") from None

    def to_json(self) -> dict[str, Any]:
        """The record for people and scripts; a stored password shows only as ``password_stored``."""
        doc: dict[str, Any] = json.loads(self.to_bytes())
        doc["password_stored"] = doc.pop("password", None) is not None
        return doc


class BookieMode(enum.Enum):
    READ_WRITE = "READ_WRITE"
    READ_ONLY = "READ_ONLY"


DEFAULT_REGION = "default-region"
DEFAULT_ZONE = "default-zone"
DEFAULT_RACK = "default-rack"


@dataclass(frozen=True, slots=True)
class BookieRegistration:
    """What a running bookie publishes (an ephemeral record)."""

    KIND: ClassVar[str] = "bookie"

    bookie_id: BookieId
    address: str  # host:port of the gRPC service
    region: str = DEFAULT_REGION
    zone: str = DEFAULT_ZONE
    rack: str = DEFAULT_RACK
    mode: BookieMode = BookieMode.READ_WRITE
    free_bytes: int = 0
    total_bytes: int = 0
    http_address: str = ""
    version: str = ""
    # The largest packed entry (header + digest + payload) this bookie accepts; clients
    # refuse a larger payload before sending it. Records written before the field
    # existed read as the default, which those bookies enforced.
    entry_size_max: int = ENTRY_SIZE_MAX_DEFAULT
    # host:port of the binary data path ("" when the bookie offers none, or predates it:
    # clients then send it everything over gRPC).
    binary_address: str = ""

    @property
    def location(self) -> str:
        """``/region/zone/rack``."""
        return f"/{self.region}/{self.zone}/{self.rack}"

    @property
    def writable(self) -> bool:
        return self.mode is BookieMode.READ_WRITE

    def to_bytes(self) -> bytes:
        return dump_record(
            self.KIND,
            {
                "bookie_id": self.bookie_id,
                "address": self.address,
                "region": self.region,
                "zone": self.zone,
                "rack": self.rack,
                "mode": self.mode.value,
                "free_bytes": self.free_bytes,
                "total_bytes": self.total_bytes,
                "http_address": self.http_address,
                "version": self.version,
                "entry_size_max": self.entry_size_max,
                "binary_address": self.binary_address,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> BookieRegistration:
        d = load_record(data, cls.KIND)
        try:
            return cls(
                bookie_id=BookieId(d["bookie_id"]),
                address=d["address"],
                region=d.get("region", DEFAULT_REGION),
                zone=d.get("zone", DEFAULT_ZONE),
                rack=d.get("rack", DEFAULT_RACK),
                mode=BookieMode(d.get("mode", "READ_WRITE")),
                free_bytes=d.get("free_bytes", 0),
                total_bytes=d.get("total_bytes", 0),
                http_address=d.get("http_address", ""),
                version=d.get("version", ""),
                entry_size_max=_positive_int(d.get("entry_size_max", ENTRY_SIZE_MAX_DEFAULT)),
                binary_address=str(d.get("binary_address", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequestError(f"bookie registration: malformed ({exc!r})") from None


@dataclass(frozen=True, slots=True)
class Cookie:
    """Binds a bookie id to its data dirs: the same cookie is in the store and in each dir."""

    KIND: ClassVar[str] = "cookie"

    bookie_id: BookieId
    instance_id: str  # random, chosen when the bookie is formatted
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return dump_record(
            self.KIND,
            {
                "bookie_id": self.bookie_id,
                "instance_id": self.instance_id,
                "journal_dirs": list(self.journal_dirs),
                "ledger_dirs": list(self.ledger_dirs),
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Cookie:
        d = load_record(data, cls.KIND)
        try:
            return cls(
                bookie_id=BookieId(d["bookie_id"]),
                instance_id=d["instance_id"],
                journal_dirs=tuple(d["journal_dirs"]),
                ledger_dirs=tuple(d["ledger_dirs"]),
            )
        except (KeyError, TypeError) as exc:
            raise BadRequestError(f"cookie: malformed ({exc!r})") from None


class RecordCodec:
    """Adapts a record class with to_bytes/from_bytes to ``update_metadata``'s Codec."""

    def __init__(self, cls: Any) -> None:
        self._cls = cls

    def to_bytes(self, value: Any) -> bytes:
        data: bytes = value.to_bytes()
        return data

    def from_bytes(self, data: bytes) -> Any:
        return self._cls.from_bytes(data)


# The names these had before they were public, for code written against them meanwhile.
_Codec = RecordCodec
_dump = dump_record
_load = load_record

LEDGER_CODEC = RecordCodec(LedgerMetadata)
BOOKIE_CODEC = RecordCodec(BookieRegistration)
COOKIE_CODEC = RecordCodec(Cookie)
