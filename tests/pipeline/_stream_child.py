"""A streaming query in its own process (driver + JVM), killed by the test mid-batch.

argv: metadata stream checkpoint sink hang_batch. Runs availableNow with 40 records a
trigger into an idempotent sink (one file per batch id, written then renamed); on
batch ``hang_batch`` it writes part of the batch to a temporary file, touches
``sink/hanging`` and waits to be SIGKILLed."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from scriba.pipeline import local_session


def main() -> None:
    metadata, stream, checkpoint, sink_dir, hang = sys.argv[1:6]
    sink = Path(sink_dir)
    spark = local_session("local[2]", "scriba-kill-child")

    def write_batch(batch_df: Any, batch_id: int) -> None:
        rows = [f"{r.position}\t{bytes(r.payload).decode()}" for r in batch_df.collect()]
        tmp = sink / f".batch-{batch_id:06d}.tmp"
        if batch_id == int(hang):
            tmp.write_text("\n".join(rows[: len(rows) // 2]))
            (sink / "hanging").touch()
            threading.Event().wait()  # until SIGKILL
        tmp.write_text("\n".join(rows))
        tmp.rename(sink / f"batch-{batch_id:06d}.txt")

    (spark.readStream.format("scriba").option("metadata", metadata).option("stream", stream)
     .option("maxRecordsPerTrigger", "40").load().writeStream.foreachBatch(write_batch)
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination())


if __name__ == "__main__":
    main()
