"""Packed range-read answers: a ``ReadRangeResponse`` whose entries travel as one run.

A client that sets ``ReadRangeRequest.packed`` gets each chunk's entries as ``sizes``
(packed) and ``packed_entries`` (the entries concatenated), the read twin of
``AddRun``: one bytes field per chunk instead of one protobuf object per entry.

The bookie builds such a chunk with :func:`encode_packed_chunk`: the small fields go
through protobuf, the entries are framed by hand so that they are copied once, by one
``b"".join`` (protobuf's serializer copies a large bytes field at well under 1 GB/s
here). The client splits a chunk with :func:`run_ends` after checking that the sizes
add up to the bytes it got. A chunk that carries ``entries`` instead came from a bookie
that predates ``packed``; both forms are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Final

from scriba.proto import scriba_pb2 as pb

__all__ = ["encode_packed_chunk", "run_ends", "varint"]

_PACKED_ENTRIES_TAG: Final = b"\x32"  # ReadRangeResponse.packed_entries: field 6, length-delimited


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_packed_chunk(first_entry_id: int, entries: Sequence[bytes]) -> bytes:
    """The serialized ``ReadRangeResponse`` (status OK) carrying ``entries`` as one run."""
    sizes = list(map(len, entries))
    head = pb.ReadRangeResponse(first_entry_id=first_entry_id, sizes=sizes).SerializeToString()
    total = sum(sizes)
    if not total:  # proto3 leaves an empty bytes field out
        return head
    return b"".join((head, _PACKED_ENTRIES_TAG, varint(total), *entries))


def run_ends(sizes: Sequence[int], blob_bytes: int) -> list[int] | None:
    """The end offset of each entry of a run (entry i is ``blob[ends[i-1]:ends[i]]``,
    from 0), or None when the sizes do not add up to ``blob_bytes``."""
    ends = list(accumulate(sizes))
    if (ends[-1] if ends else 0) != blob_bytes:
        return None
    return ends
