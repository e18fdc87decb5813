"""Helpers of the pipeline tests: streams written and read through the client alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from scriba.cli import build_parser
from scriba.client import Client
from scriba.meta.records import LEDGERS_PREFIX, LedgerMetadata
from scriba.pipeline.staging import StagingRecord, staging_prefix
from scriba.stream import Position, open_namespace
from scriba.testing.checkers.acked_set import check_acked_set
from scriba.testing.waiting import wait_until

Rec = tuple[str, bytes, dict[str, bytes]]


def _ns() -> str:
    return f"n{uuid.uuid4().hex[:8]}"


async def _append(uri: str, ns: str, stream: str, records: list[tuple[bytes, dict[str, bytes]]],
                  *, batch: int = 25, segment_records_max: int = 120) -> list[Position]:
    async with Client.connect(uri) as client:
        namespace = await open_namespace(client, ns, create=True, segment_records_max=segment_records_max)
        writer = await namespace.open_writer(stream, create=True)
        positions = []
        for i in range(0, len(records), batch):
            positions += await writer.append_many(records[i:i + batch])
        await writer.close()
        return positions


async def _read(uri: str, ns: str, stream: str, start: str = "earliest") -> list[Rec]:
    async with Client.connect(uri) as client:
        namespace = await open_namespace(client, ns)
        end = await namespace.open_reader(stream, "latest")
        stop = end.position
        await end.close()
        out: list[Rec] = []
        async with await namespace.open_reader(stream, start) as reader:
            while True:
                rec = await reader.read_next(timeout_s=0.5)
                if rec is None:
                    break
                out.append((str(rec.position), rec.payload, dict(rec.headers)))
        assert not out or Position.parse(out[-1][0]) < stop
        return out


async def _staged_outside(uri: str, ns: str, stream: str) -> list[int]:
    """Ledgers staged for ``ns/stream`` that are not (or no longer) its segments."""
    async with Client.connect(uri) as client:
        record = (await (await open_namespace(client, ns)).catalog.read_stream(stream)).value
        segments = {s.ledger_id for s in record.segments}
        found = []
        async for key, raw in client.store.scan(LEDGERS_PREFIX):
            meta = LedgerMetadata.from_bytes(raw.value).custom_metadata
            if meta.get("stream") == f"{ns}/{stream}" and meta.get("staged"):
                found.append(int(key.rsplit("/", 1)[-1]))
        return sorted(set(found) - segments)


async def _staging_jobs(uri: str, stream: str) -> dict[str, str]:
    """The exactly-once jobs recorded for ``stream`` ("ns/stream"): job -> state."""
    async with Client.connect(uri) as client:
        return {StagingRecord.from_bytes(raw.value).job: StagingRecord.from_bytes(raw.value).state
                async for _, raw in client.store.scan(staging_prefix(stream))}


def _exactly_once(wanted: list[bytes], read: list[bytes]) -> None:
    """The acked-set checker (nothing lost, nothing unexpected, nothing twice) and the order."""
    result = check_acked_set(wanted, wanted, read)
    assert result.ok and not result.duplicated, result.explain()
    assert read == wanted  # and in order


def _payloads(uri: str, ns: str, stream: str = "out") -> list[bytes]:
    return [p for _, p, _ in asyncio.run(_read(uri, ns, stream))]


def _until(cond: Any, what: str, bound_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Wait for ``cond()`` while the child ``proc`` lives, at most ``bound_s``."""

    def held() -> bool:
        if cond():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"child exited ({proc.returncode}) before {what}")
        return False

    wait_until(held, bound_s, what=what, interval_s=0.1)


def _records(n: int, tag: str = "r") -> list[tuple[bytes, dict[str, bytes]]]:
    return [(f"{tag}{i}".encode(), {"i": str(i).encode()} if i % 3 else {}) for i in range(n)]


def main(argv: list[str]) -> int:
    """``scriba ARGV`` without ``scriba.cli.main``'s logging setup (bound to pytest's capture)."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def dying_frame(spark: Any, total: int, marker: Path, die_at: int = 2500) -> Any:
    """One partition of payloads ``k0..k<total-1>`` whose Python worker dies (``os._exit``) at
    row ``die_at`` the first time (``marker`` records that it did)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def payload(i: int) -> bytes:
        if i == die_at and not marker.exists():  # the first attempt's worker dies here
            marker.touch()
            os._exit(1)
        return b"k%d" % i

    return spark.range(total).coalesce(1).select(F.udf(payload, BinaryType(), useArrow=False)("id").alias("payload"))
