"""Benchmark: a stream read into a Spark DataFrame against the same read through the client alone.

1. A fresh cluster: a 1-member etcd and 3 bookie processes (zones z1..z3).
2. One client appends ``--records`` records (default 1 000 000, the issue's figure) of
   ``--size`` bytes to a stream (batches of 1000, one segment).
3. Baseline, in the same run: the client reads the whole stream with one catch-up
   reader (``read_batch`` until every record is in, summing the payload lengths); then
   Spark (``local[N]``, N = the most partitions asked) reads it with 1, 2 and 4
   partitions (``maxRecordsPerPartition``), forcing every payload
   (``sum(length(payload))``). The session is started, and one untimed read done,
   before timing.
4. Spark appends ``--records`` rows (2 tasks) to another stream, at-least-once (tasks
   queue on the writer lock) and exactly-once (tasks stage ledgers in parallel, the
   commit adopts them in one CAS), each against the client's write.

Prints rows/s of each, the ratio Spark/client and each partition count's speed-up over
one partition (``--json OUT`` writes them too). The machine has 2 cores
(``os.cpu_count()`` is printed) shared by every process, the bookies and etcd
included: figures vary, and more partitions than cores cannot scale.

Run: ``.venv/bin/python benchmarks/bench_pipeline.py [--records N] [--size 100] [--json OUT]``
(smoke it with ``--records 20000``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from scriba.grpc_runtime import apply_defaults

apply_defaults()

from scriba.client import Client  # noqa: E402
from scriba.embedded.etcd import EtcdCluster  # noqa: E402
from scriba.stream import open_namespace  # noqa: E402
from scriba.testing.cluster import BookieCluster  # noqa: E402


async def _write(uri: str, records: int, size: int) -> None:
    async with Client.connect(uri) as client:
        ns = await open_namespace(client, "bench", create=True, segment_records_max=records)  # one segment: partitions split it
        writer = await ns.open_writer("s", create=True)
        body = b"x" * size
        for i in range(0, records, 1000):
            await writer.append_many([(body, None)] * min(1000, records - i))
        await writer.close()


async def _client_read(uri: str, records: int) -> tuple[int, int]:
    """(records, payload bytes) read by one catch-up reader from the earliest record to the last."""
    async with Client.connect(uri) as client:
        ns = await open_namespace(client, "bench")
        n = size = 0
        async with await ns.open_reader("s", "earliest") as reader:
            while n < records:
                batch = await reader.read_batch(65536, timeout_s=60.0)
                if not batch:
                    break
                n += len(batch)
                size += sum(len(r.payload) for r in batch)
        return n, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", default="1,2,4")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    records = args.records
    figures: dict[str, float | int] = {"cores": os.cpu_count() or 0, "records": records, "size_bytes": args.size}
    print(f"cores: {os.cpu_count()} (shared with everything else on the machine); {records:,} records "
          f"of {args.size} B")
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdCluster(Path(tmp) / "etcd", members=1)
        etcd.start()
        uri = str(etcd.uri("bench-pipeline"))
        bookies = BookieCluster(Path(tmp) / "bookies", uri)
        bookies.start_bookies(3, zones=["z1", "z2", "z3"])
        try:
            t = time.perf_counter()
            asyncio.run(_write(uri, records, args.size))
            write_base = records / (time.perf_counter() - t)
            print(f"write (client, batches of 1000): {write_base:,.0f} rows/s  [baseline]")
            t = time.perf_counter()
            n, size = asyncio.run(_client_read(uri, records))
            base = n / (time.perf_counter() - t)
            assert (n, size) == (records, records * args.size), (n, size, records)
            print(f"read (client, one catch-up reader): {base:,.0f} rows/s  [baseline]")
            figures |= {"client_write_rows_per_s": round(write_base), "client_read_rows_per_s": round(base)}
            figures |= _spark(uri, records, args.size, base, write_base, [int(p) for p in args.partitions.split(",")])
        finally:
            bookies.stop_all()
            etcd.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


async def _create(uri: str, stream: str) -> None:
    async with Client.connect(uri) as client:
        ns = await open_namespace(client, "bench")
        await (await ns.open_writer(stream, create=True)).close()


def _spark(uri: str, records: int, size: int, base: float, write_base: float, partitions: list[int]
           ) -> dict[str, float]:
    from pyspark.sql import functions as F

    from scriba.pipeline import local_session

    spark = local_session(f"local[{max(partitions)}]", "bench-pipeline")
    figures: dict[str, float] = {}
    one = 1.0
    try:
        warm = spark.read.format("scriba").option("metadata", uri).option("stream", "bench/s").load()
        warm.agg(F.count("*")).collect()  # untimed: starts the Python workers and the JVM's code paths
        for p in partitions:
            df = (spark.read.format("scriba").option("metadata", uri).option("stream", "bench/s")
                  .option("maxRecordsPerPartition", str(-(-records // p))).load())
            t = time.perf_counter()
            row = df.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b")).collect()[0]
            rate = row.n / (time.perf_counter() - t)
            assert (row.n, row.b) == (records, records * size), (row.n, row.b, records)
            if p == partitions[0]:
                one = rate
            figures[f"spark_read_rows_per_s_{p}"] = round(rate)
            figures[f"spark_read_ratio_client_{p}"] = round(rate / base, 3)
            scaling = f", {rate / one:.2f}x {partitions[0]} partition(s)" if p != partitions[0] else ""
            print(f"read (Spark, {df.rdd.getNumPartitions()} partitions): {rate:,.0f} rows/s  "
                  f"ratio {rate / base:.2f}x the client{scaling}")
        # write: N payloads appended through the source (tasks queue on the writer lock)
        asyncio.run(_create(uri, "out"))
        rows = spark.range(records).select(F.lit(b"x" * size).alias("payload")).coalesce(2).persist()
        rows.count()
        t = time.perf_counter()
        rows.write.format("scriba").option("metadata", uri).option("stream", "bench/out").mode("append").save()
        rate = records / (time.perf_counter() - t)
        print(f"write (Spark, 2 tasks): {rate:,.0f} rows/s  ratio {rate / write_base:.2f}x the client's write")
        figures |= {"spark_write_rows_per_s": round(rate), "spark_write_ratio_client": round(rate / write_base, 3)}
        asyncio.run(_create(uri, "out-eo"))
        t = time.perf_counter()
        (rows.write.format("scriba").option("metadata", uri).option("stream", "bench/out-eo")
         .option("delivery", "exactly-once").mode("append").save())
        rate = records / (time.perf_counter() - t)
        print(f"write exactly-once (Spark, 2 tasks, staged + one adopt): {rate:,.0f} rows/s  "
              f"ratio {rate / write_base:.2f}x the client's write")
        figures |= {"spark_write_eo_rows_per_s": round(rate), "spark_write_eo_ratio_client": round(rate / write_base, 3)}
    finally:
        spark.stop()
    return figures


if __name__ == "__main__":
    main()
