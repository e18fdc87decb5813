"""Options, read tasks and offsets of the ``scriba`` data source (I/O-free).

The driver learns each stream's segments (:class:`SegmentSpan`: ledger, last
entry, record count) and turns a position range ``[start, end)`` into
:class:`ReadTask` s: one per segment, a large segment split into entry ranges of
about ``maxRecordsPerPartition`` records (estimated from the segment's average
records per entry; an open segment counts one record per entry). A task carries
everything an executor needs (metadata URI, ledger, entry range, the exact
position bounds), so nothing on the driver is needed to run it.

TLS: options ``tls.cert``, ``tls.key``, ``tls.ca`` (paths every executor can read) and
``tls.serverName`` make every connection (driver and tasks) dial the bookies over
(mutual) TLS; :func:`tls_options` is the inverse, for jobs that hand their config on.

Streaming offsets are ``{"ns/stream": "SEG:ENTRY:SLOT", ...}`` with sorted keys:
Spark compares offsets as JSON text, so the same positions must always encode
the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scriba.errors import ConfigError
from scriba.stream.position import Position
from scriba.tls import TlsConfig

MAX_RECORDS_PER_PARTITION_DEFAULT: Final = 100_000
CALL_TIMEOUT_S_DEFAULT: Final = 120.0
WRITER_LOCK_TIMEOUT_S_DEFAULT: Final = 3600.0
"""How long a write task waits for the stream's writer lock: at-least-once tasks hold it for
their whole partition and queue behind each other (and an exactly-once commit takes it too)."""
STAGING_GRACE_S_DEFAULT: Final = 24 * 3600.0
"""How long an exactly-once job's staged ledgers may wait for its commit before a later job
(or ``scriba pipeline gc-staged``) collects them: see :mod:`scriba.pipeline.staging`."""
WRITE_BATCH_RECORDS: Final = 1000

SCHEMA_DDL: Final = (
    "namespace STRING, stream STRING, segment BIGINT, ledger_id BIGINT, entry_id BIGINT, "
    "slot INT, position STRING, payload BINARY, headers MAP<STRING, BINARY>, "
    "publish_time TIMESTAMP, origin STRING"
)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The data source's options, checked (Spark option names are case-insensitive)."""

    metadata: str
    password: bytes = b""
    streams: tuple[str, ...] = ()  # "ns/stream"
    namespace: str | None = None  # every stream of it (listed on the driver)
    ledgers: tuple[int, ...] = ()  # raw ledgers: one row per entry
    starting: str = "earliest"  # "earliest" | "latest" | "SEG:ENTRY:SLOT" | JSON map (streaming)
    ending: str = "latest"
    max_records_per_partition: int = MAX_RECORDS_PER_PARTITION_DEFAULT
    max_records_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    create_stream: bool = False
    call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT
    staging_grace_s: float = STAGING_GRACE_S_DEFAULT  # exactly-once writes
    writer_lock_timeout_s: float = WRITER_LOCK_TIMEOUT_S_DEFAULT  # writes
    tls: TlsConfig | None = None  # dial the bookies over TLS (None: plaintext)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    opts = {k.lower(): v for k, v in options.items()}
    metadata = opts.get("metadata", "").strip()
    if not metadata:
        raise ConfigError("the scriba data source needs option('metadata', URI), e.g. etcd://host:2379/prefix")
    stream = opts.get("stream", "").strip()
    namespace = opts.get("namespace", "").strip() or None
    ledgers = tuple(_ints(opts["ledgers"], "ledgers")) if opts.get("ledgers", "").strip() else ()
    if sum(bool(x) for x in (stream, namespace, ledgers)) != 1:
        raise ConfigError("give exactly one of option('stream', 'ns/stream'), option('namespace', ns) "
                          "or option('ledgers', '1,2,3')")
    streams = tuple(split_stream(s) for s in stream.split(",")) if stream else ()
    return SourceOptions(
        metadata=metadata,
        password=opts.get("password", "").encode(),
        streams=tuple(f"{ns}/{name}" for ns, name in streams),
        namespace=namespace,
        ledgers=ledgers,
        starting=(opts.get("startingposition") or opts.get("startingpositions") or "earliest").strip(),
        ending=(opts.get("endingposition") or "latest").strip(),
        max_records_per_partition=_positive(opts, "maxrecordsperpartition") or MAX_RECORDS_PER_PARTITION_DEFAULT,
        max_records_per_trigger=_positive(opts, "maxrecordspertrigger"),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        create_stream=_bool(opts, "createstream", False),
        call_timeout_s=float(_positive(opts, "calltimeouts") or CALL_TIMEOUT_S_DEFAULT),
        staging_grace_s=_seconds(opts, "staginggraces", STAGING_GRACE_S_DEFAULT),
        writer_lock_timeout_s=_seconds(opts, "writerlocktimeouts", WRITER_LOCK_TIMEOUT_S_DEFAULT),
        tls=_tls(opts),
    )


_TLS_OPTIONS: Final = {"cert": "tls.cert", "key": "tls.key", "ca": "tls.ca", "server_name": "tls.serverName"}


def _tls(opts: Mapping[str, str]) -> TlsConfig | None:
    given = {field: opts[name.lower()].strip() for field, name in _TLS_OPTIONS.items()
             if opts.get(name.lower(), "").strip()}
    if not given:
        return None
    cert, key, ca = (Path(given[k]) if k in given else None for k in ("cert", "key", "ca"))
    return TlsConfig(cert=cert, key=key, ca=ca, server_name=given.get("server_name")).validate()


def tls_options(tls: TlsConfig | None) -> dict[str, str]:
    """The data source options that carry ``tls`` (none for None)."""
    if tls is None:
        return {}
    values = {"cert": tls.cert, "key": tls.key, "ca": tls.ca, "server_name": tls.server_name}
    return {_TLS_OPTIONS[k]: str(v) for k, v in values.items() if v is not None}


def split_stream(text: str) -> tuple[str, str]:
    """``"ns/with/slashes/stream"`` -> (namespace, stream): the stream is the last part."""
    ns, sep, name = text.strip().rpartition("/")
    if not sep or not ns or not name:
        raise ConfigError(f"stream {text!r} must be 'namespace/stream'")
    return ns, name


def parse_ledger_ids(text: str) -> list[int]:
    """``"1,2,3"`` -> [1, 2, 3] (ConfigError for anything else)."""
    return _ints(text, "ledgers")


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"option {name} must be comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ConfigError(f"option {name}: ids are >= 0, got {text!r}")
    return values


def _positive(opts: Mapping[str, str], name: str) -> int | None:
    if name not in opts:
        return None
    try:
        value = int(opts[name])
    except ValueError:
        raise ConfigError(f"option {name} must be a positive integer, got {opts[name]!r}") from None
    if value <= 0:
        raise ConfigError(f"option {name} must be a positive integer, got {value}")
    return value


def _seconds(opts: Mapping[str, str], name: str, default: float) -> float:
    if name not in opts:
        return default
    try:
        value = float(opts[name])
    except ValueError:
        raise ConfigError(f"option {name} must be a number of seconds, got {opts[name]!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"option {name} must be a finite number of seconds >= 0, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option {name} must be true or false, got {text!r}")
    return text.strip().lower() == "true"


# --- read tasks -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SegmentSpan:
    """What the driver knows of one segment: its entries ``0..last_entry`` (-1: none)."""

    seq: int
    ledger_id: int
    last_entry: int
    record_count: int | None  # known for a closed segment
    is_open: bool

    @property
    def end(self) -> Position:
        """The position right after its last readable record."""
        return Position(self.seq, self.last_entry + 1, 0) if self.is_open else Position(self.seq + 1, 0, 0)


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One Spark partition: entries ``first_entry..last_entry`` of one ledger.

    For a stream segment, only records with ``start <= position < end`` are returned;
    ``stream`` None means a raw ledger (one row per entry).
    """

    metadata: str
    password: bytes
    namespace: str | None
    stream: str | None
    segment_seq: int | None
    ledger_id: int
    first_entry: int
    last_entry: int
    start: Position | None = None
    end: Position | None = None
    call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT
    tls: TlsConfig | None = None


def plan_stream(
    opts: SourceOptions, namespace: str, stream: str, spans: list[SegmentSpan], start: Position, end: Position
) -> list[ReadTask]:
    """The tasks reading ``[start, end)`` of one stream."""
    tasks = []
    for span in spans:
        if span.seq < start.segment_seq or span.seq > end.segment_seq or span.last_entry < 0:
            continue
        first = start.entry_id if span.seq == start.segment_seq else 0
        last = span.last_entry
        if span.seq == end.segment_seq:
            last = min(last, end.entry_id if end.slot > 0 else end.entry_id - 1)
        if first > last:
            continue
        step = entries_per_task(span, opts.max_records_per_partition)
        for lo in range(first, last + 1, step):
            tasks.append(ReadTask(opts.metadata, opts.password, namespace, stream, span.seq, span.ledger_id,
                                  lo, min(last, lo + step - 1), start, end, opts.call_timeout_s, opts.tls))
    return tasks


def entries_per_task(span: SegmentSpan, max_records: int) -> int:
    entries = span.last_entry + 1
    if not span.record_count or entries <= 0:
        return max_records
    return max(1, max_records * entries // span.record_count)


def plan_ledger(opts: SourceOptions, ledger_id: int, last_entry: int, entries_per_task: int) -> list[ReadTask]:
    return [
        ReadTask(opts.metadata, opts.password, None, None, None, ledger_id, lo,
                 min(last_entry, lo + entries_per_task - 1), call_timeout_s=opts.call_timeout_s, tls=opts.tls)
        for lo in range(0, last_entry + 1, entries_per_task)
    ]


# --- streaming offsets --------------------------------------------------------------------
def encode_offset(positions: Mapping[str, Position]) -> dict[str, str]:
    return {key: str(positions[key]) for key in sorted(positions)}


def decode_offset(offset: Mapping[str, str] | str) -> dict[str, Position]:
    if isinstance(offset, str):
        offset = json.loads(offset)
    if not isinstance(offset, Mapping):
        raise ConfigError(f"a scriba offset is a JSON object of stream -> position, got {offset!r}")
    return {str(k): Position.parse(v) for k, v in offset.items()}


def starting_positions(text: str, streams: list[str]) -> dict[str, str]:
    """``startingPositions``: "earliest", "latest", or JSON {"ns/s": "SEG:ENTRY:SLOT"|"earliest"|"latest"}
    (streams it does not name start at earliest)."""
    text = text.strip()
    if not text.startswith("{"):
        return dict.fromkeys(streams, text)
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"startingPositions is not valid JSON: {exc}") from None
    unknown = set(given) - set(streams)
    if unknown:
        raise ConfigError(f"startingPositions names streams not read: {sorted(unknown)}")
    return {s: str(given.get(s, "earliest")) for s in streams}
