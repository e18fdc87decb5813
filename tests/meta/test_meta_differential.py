"""Differential test: the same seeded random operations on memory:// (the model) and on each
real backend give the same outcomes — values, error types, listings, transaction results.

Versions differ in number between drivers, so operations name them symbolically:
"the current version of k" or "the version k had before its last write" (stale).
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import pytest

from scriba.errors import ScribaError
from scriba.meta import connect
from scriba.meta.store import Check, Delete, MetadataStore, Put

if TYPE_CHECKING:
    from conftest import Backend, StoreFactory

SEED = int(os.environ.get("SCRIBA_META_SEED", "20261122"))
OPS = 250
KEYS = ["k/a", "k/b", "k/c", "k/d"]


@dataclass
class Side:
    """One store and the versions it has handed out for each key since its last creation."""

    store: MetadataStore
    versions: dict[str, list[int]] = field(default_factory=dict)

    def pick(self, key: str, stale: bool) -> int:
        seen = self.versions.get(key, [])
        if stale and len(seen) >= 2:
            return seen[-2]
        return seen[-1] if seen else 1

    def wrote(self, key: str, version: int, *, created: bool = False) -> None:
        if created:
            self.versions[key] = []
        self.versions.setdefault(key, []).append(version)


async def apply(side: Side, op: tuple[object, ...]) -> object:
    """Run one abstract operation; return a comparable outcome (value or error type name)."""
    kind, key = op[0], str(op[1])
    s = side.store
    try:
        if kind == "get":
            return (await s.get(key)).value
        if kind == "create":
            side.wrote(key, await s.create(key, cast(bytes, op[2])), created=True)
            return "ok"
        if kind == "set":
            side.wrote(key, await s.set(key, cast(bytes, op[2]), expected_version=side.pick(key, bool(op[3]))))
            return "ok"
        if kind == "delete":
            version = None if op[2] is None else side.pick(key, bool(op[2]))
            await s.delete(key, expected_version=version)
            return "ok"
        if kind == "list":
            return [(k, v.value) for k, v in await s.list("k/")]
        if kind == "txn":
            other = str(op[2])
            checks = [Check(key, side.pick(key, bool(op[3])) if side.versions.get(key) else None)]
            await s.txn(checks, [Put(other, b"txn"), Delete(key)] if op[4] else [Put(other, b"txn")])
            for k in (key, other):  # a transaction changes versions: learn them again
                try:
                    side.wrote(k, (await s.get(k)).version, created=True)
                except ScribaError:
                    side.versions.pop(k, None)
            return "ok"
    except ScribaError as exc:
        return type(exc).__name__
    raise AssertionError(f"unknown op {op}")


def operations(rng: random.Random) -> list[tuple[object, ...]]:
    ops: list[tuple[object, ...]] = []
    for i in range(OPS):
        key = rng.choice(KEYS)
        kind = rng.choices(["get", "create", "set", "delete", "list", "txn"], [3, 3, 4, 2, 1, 1])[0]
        if kind == "create":
            ops.append(("create", key, f"c{i}".encode()))
        elif kind == "set":
            ops.append(("set", key, f"s{i}".encode(), rng.random() < 0.3))
        elif kind == "delete":
            ops.append(("delete", key, rng.choice([None, False, True])))
        elif kind == "txn":
            ops.append(("txn", key, rng.choice([k for k in KEYS if k != key]), rng.random() < 0.3, rng.random() < 0.5))
        else:
            ops.append((kind, key))
    return ops


async def test_a_backend_behaves_like_the_memory_model(backend: Backend, make_store: StoreFactory) -> None:
    if backend.cluster is None:
        pytest.skip("memory:// is the model")
    model = Side(await connect(f"memory://model-{uuid.uuid4().hex[:8]}"))
    real = Side(await make_store())
    try:
        for step, op in enumerate(operations(random.Random(SEED))):
            want, got = await apply(model, op), await apply(real, op)
            assert got == want, f"seed {SEED} step {step} {op}: {backend.name} gave {got!r}, memory {want!r}"
    finally:
        await model.store.close()
