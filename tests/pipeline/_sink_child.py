"""A streaming query from one stream into another through the exactly-once sink, in its own
process (driver + JVM), killed by the test mid-batch.

argv: metadata source_stream out_stream checkpoint marker. 40 records a trigger; the row
whose payload is ``r50`` (batch 1) touches ``marker`` and waits to be SIGKILLed."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from scriba.pipeline import local_session


def query(spark: Any, metadata: str, source: str, out: str, checkpoint: str, hang_on: bytes | None,
          marker: Path | None) -> Any:
    """The query (the test restarts the same one, without the hang, from the checkpoint)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def same(payload: bytes) -> bytes:
        if hang_on is not None and bytes(payload) == hang_on and marker is not None:
            marker.touch()
            threading.Event().wait()  # until SIGKILL
        return bytes(payload)

    return (spark.readStream.format("scriba").option("metadata", metadata).option("stream", source)
            .option("maxRecordsPerTrigger", "40").load()
            .select(F.udf(same, BinaryType(), useArrow=False)("payload").alias("payload"), "headers")
            .writeStream.format("scriba").option("metadata", metadata).option("stream", out)
            .option("delivery", "exactly-once").option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start())


def main() -> None:
    metadata, source, out, checkpoint, marker = sys.argv[1:6]
    spark = local_session("local[2]", "scriba-sink-child")
    query(spark, metadata, source, out, checkpoint, b"r50", Path(marker)).awaitTermination()


if __name__ == "__main__":
    main()
