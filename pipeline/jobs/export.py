"""``export``: streams to Parquet for analytics and backfills; a re-run resumes where the last stopped.

Theory of operation. Per stream, the driver fixes the range ``[start, end)``: ``end``
is the stream's end as the driver sees it when the job starts (so concurrent appends
wait for the next run), ``start`` the ``end`` the last successful run recorded (else
"earliest"). One Spark job reads every range through the ``scriba`` source and appends
it to ``DIR`` with ``partitionBy("namespace", "stream", "date")`` (``date`` is the UTC
day of ``publish_time``); every row keeps its position (``segment``, ``entry_id``,
``slot``, ``position``). Only after Spark committed the files are the new ``end``
positions written to ``DIR/_scriba_export/positions.json`` (write-then-rename;
Spark's readers skip ``_`` paths).

Guarantee: nothing is skipped, a range is exported again only if a run died between
Spark's commit and the positions file (the rows carry their positions, so such
duplicates are recognisable: ``dropDuplicates(["namespace", "stream", "position"])``).
A stream truncated past the recorded position fails the run (``fail_on_data_loss``,
as in the source) unless told to skip ahead.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scriba.errors import ConfigError
from scriba.pipeline.access import Access
from scriba.pipeline.plan import SCHEMA_DDL, split_stream, tls_options
from scriba.tls import TlsConfig

STATE_DIR = "_scriba_export"
STATE_FILE = "positions.json"
EXPORT_SCHEMA_DDL = SCHEMA_DDL + ", date DATE"


@dataclass(frozen=True, slots=True)
class ExportReport:
    streams: int
    records: int
    ranges: dict[str, tuple[str, str]]  # stream -> (start, end) exported this run
    directory: str

    def line(self) -> str:
        return f"export: {self.records} records of {self.streams} streams to {self.directory}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def read_positions(directory: str | Path) -> dict[str, str]:
    """The positions the last successful run ended at (stream -> "SEG:ENTRY:SLOT")."""
    path = Path(directory) / STATE_DIR / STATE_FILE
    if not path.exists():
        return {}
    loaded = json.loads(path.read_text())
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} is not a JSON object of stream -> position")
    return {str(k): str(v) for k, v in loaded.items()}


def _write_positions(directory: Path, positions: dict[str, str]) -> None:
    state = directory / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / f".{STATE_FILE}.tmp"
    with open(tmp, "w") as f:
        json.dump(positions, f, sort_keys=True, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state / STATE_FILE)


def export(
    spark: Any, metadata: str, directory: str | Path, *, streams: tuple[str, ...] = (),
    namespace: str | None = None, password: str = "", fail_on_data_loss: bool = True,
    max_records_per_partition: int | None = None, tls: TlsConfig | None = None,
) -> ExportReport:
    """Export ``streams`` (or every stream of ``namespace``) to Parquet under ``directory``;
    ``tls``: the driver and every task dial the bookies with it."""
    from pyspark.sql import functions as F

    if bool(streams) == (namespace is not None):
        raise ConfigError("export needs streams or a namespace (one of them)")
    for s in streams:
        split_stream(s)
    out = Path(directory)
    done = read_positions(out)
    ranges: dict[str, tuple[str, str]] = {}
    with Access(metadata, password.encode(), tls=tls) as access:
        names = list(streams) or [f"{namespace}/{s}" for s in access.list_streams(namespace or "")]
        for full in names:
            view = access.view(full)
            start = view.resolve(done.get(full, "earliest"), fail_on_data_loss=fail_on_data_loss)
            if view.latest > start:
                ranges[full] = (str(start), str(view.latest))
    frames = []
    for full, (first, last) in ranges.items():
        reader = (spark.read.format("scriba").option("metadata", metadata).option("stream", full)
                  .option("password", password).option("startingPosition", first)
                  .option("endingPosition", last).option("failOnDataLoss", str(fail_on_data_loss).lower())
                  .options(**tls_options(tls)))
        if max_records_per_partition is not None:
            reader = reader.option("maxRecordsPerPartition", str(max_records_per_partition))
        frames.append(reader.load())
    records = 0
    if frames:
        df = frames[0]
        for more in frames[1:]:
            df = df.unionByName(more)
        before = _exported(spark, out)
        df.withColumn("date", F.to_date(F.col("publish_time"))).write.mode("append") \
            .partitionBy("namespace", "stream", "date").parquet(str(out))
        records = _exported(spark, out) - before  # Parquet counts from its footers
    _write_positions(out, {**done, **{s: end for s, (_, end) in ranges.items()}})
    return ExportReport(len(ranges), records, ranges, str(out))


def _exported(spark: Any, out: Path) -> int:
    return int(read_export(spark, out).count()) if any(out.glob("namespace=*")) else 0


def read_export(spark: Any, directory: str | Path) -> Any:
    """The exported rows (partition columns typed as exported, not inferred)."""
    return spark.read.schema(EXPORT_SCHEMA_DDL).parquet(str(directory))
