"""The console's decoded records, bounded by the live key set by construction.

Every page decodes the mirror's records (a ledger's metadata, a stream's record, a
bookie's registration, ...); decoding thousands of them per page view would cost more than
rendering, so :class:`DecodeCache` keeps each decode, valid for one version of its key.

The bound is structural, not a pruning rule: the mirror calls :meth:`DecodeCache.forget`
for every key it drops (deleted in the store, gone at a resync, or below a record that
went), and that drops every decode of the key at once. A decode is only ever stored for
a key the mirror holds, so at every moment the cache holds at most one decode per live
key per decoder — however many records were created and deleted before. (An earlier rule
pruned decodes of deleted keys only once the cache reached ``2 x live + 1000`` entries:
with 10,000 live ledgers some 11,000 deleted records' decodes were kept, about 1 KB
each, and the console's memory grew until then.)
"""

from __future__ import annotations

from typing import Any, Final

MISS: Final = object()  # get(): no decode of this key at this version (a record may decode to None)


class DecodeCache:
    """``(decoder, key) -> (version, record)``, grouped by key so a key goes in one step."""

    def __init__(self) -> None:
        self._by_key: dict[str, dict[str, tuple[int, Any]]] = {}  # key -> decoder -> (version, record)

    def get(self, decoder: str, key: str, version: int) -> Any:
        """The record ``decoder`` made of ``key`` at ``version``; :data:`MISS` if none."""
        hit = self._by_key.get(key, {}).get(decoder)
        return hit[1] if hit is not None and hit[0] == version else MISS

    def put(self, decoder: str, key: str, version: int, record: Any) -> None:
        """Keep ``record`` for ``key`` at ``version`` (replacing an older version's)."""
        self._by_key.setdefault(key, {})[decoder] = (version, record)

    def forget(self, key: str) -> None:
        """``key`` went: drop every decode of it."""
        self._by_key.pop(key, None)

    def keys(self) -> set[str]:
        return set(self._by_key)

    def __len__(self) -> int:
        """The number of decodes held (one key may have one per decoder)."""
        return sum(len(d) for d in self._by_key.values())
