"""An exactly-once batch write in its own process (driver + JVM), killed by the test before commit.

argv: metadata stream marker. Writes ids 0..999 in two partitions with
``maxRecordsPerPartition`` 100: partition 0 stages its 5 ledgers and finishes; partition
1's row 600 touches ``marker`` and waits to be SIGKILLed, so the job never commits."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from scriba.pipeline import local_session


def main() -> None:
    metadata, stream, marker_path = sys.argv[1:4]
    marker = Path(marker_path)
    spark = local_session("local[2]", "scriba-write-child")

    def payload(i: int) -> bytes:
        if i == 600:
            marker.touch()
            threading.Event().wait()  # until SIGKILL
        return b"k%d" % i

    df = spark.range(0, 1000, numPartitions=2).select(F.udf(payload, BinaryType(), useArrow=False)("id").alias("payload"))
    (df.write.format("scriba").option("metadata", metadata).option("stream", stream)
     .option("delivery", "exactly-once").option("maxRecordsPerPartition", "100").mode("append").save())


if __name__ == "__main__":
    main()
