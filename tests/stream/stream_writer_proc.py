"""A stream writer in its own process, for fail-over tests.

    python stream_writer_proc.py URI NAMESPACE STREAM TAG [SEGMENT_RECORDS_MAX]

Appends ``TAG-<i>`` (i = 0, 1, ...) forever, 8 in flight, and prints one line per
outcome, flushed: ``OK <position> <value>`` once confirmed, ``ERR <value> <error
type> <message>`` once failed. After a failure it keeps trying new appends (each
fails at once and is reported), so a fenced writer shows what it saw.
"""

from __future__ import annotations

import asyncio
import sys

from scriba.client import Client, ClientConfig
from scriba.errors import ScribaError
from scriba.meta.connect import connect
from scriba.stream import WriterOptions, open_namespace

WINDOW = 8


async def main(uri: str, namespace: str, stream: str, tag: str, records_max: int) -> None:
    store = await connect(uri, session_timeout_s=2.0)
    client = await Client.connect(uri, store=store, config=ClientConfig(add_timeout_s=5.0))
    ns = await open_namespace(client, namespace, create=True)
    writer = await ns.open_writer(stream, create=True, options=WriterOptions(lock_timeout_s=60.0),
                                  segment_records_max=records_max)
    print(f"OPEN {writer.token}", flush=True)
    i = 0
    while True:
        values = [f"{tag}-{i + k}".encode() for k in range(WINDOW)]
        i += WINDOW
        futures = []
        for value in values:
            try:
                futures.append((value, writer.append_async(value)))
            except ScribaError as exc:
                print(f"ERR {value.decode()} {type(exc).__name__} {exc}", flush=True)
        for value, future in futures:
            try:
                position = await future
                print(f"OK {position} {value.decode()}", flush=True)
            except ScribaError as exc:
                print(f"ERR {value.decode()} {type(exc).__name__} {exc}", flush=True)
        if writer.error is not None:
            await asyncio.sleep(0.05)  # the child's pacing while its writer is broken, not a test's wait


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], args[3], int(args[4]) if len(args) > 4 else 50))
