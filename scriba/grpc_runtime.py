"""Process-wide gRPC settings that Scriba's entry points apply before gRPC loads.

gRPC Python 1.85 moves every message through gRPC core's EventEngine, whose thread
pool hands each read and write to the asyncio loop. On these 2-core machines the older
polling path (the EventEngine client, listener and endpoint experiments turned off)
measured much cheaper per message: a bidi-stream echo round trip went from 0.39 to
0.23 ms p50 and the server's CPU per message from 206 to 116 us; one bookie add at 1k/s
from 0.82 to 0.58 ms p50 (memory storage); one confirmed E3/W3/A2 append from about
2.0 to 1.8 ms p50. Throughput under load did not change. ``benchmarks/bench_bookie.py``
and ``bench_client.py`` run with whatever the environment says.

gRPC reads ``GRPC_EXPERIMENTS`` once, when it loads: the default only takes effect if
set before the first ``import grpc``. ``scriba`` and ``scriba bookie`` do it first
thing; a program embedding the client calls :func:`apply_defaults` before importing
anything that imports gRPC. An explicit ``GRPC_EXPERIMENTS`` is left alone (set it
to an empty string to keep gRPC's own defaults).
"""

from __future__ import annotations

import os
import sys
from typing import Final

GRPC_EXPERIMENTS_DEFAULT: Final = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)


def apply_defaults() -> bool:
    """Set Scriba's gRPC defaults unless the environment chose; True if they can still
    take effect (gRPC not loaded yet in this process)."""
    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS_DEFAULT)
    return "grpc" not in sys.modules
