"""Cookies: bind a bookie id to its data dirs, so a wiped or swapped disk is caught at start.

Each cookie dir (the data dir, and the journal dir when separate) holds a ``COOKIE``
file; the metadata store holds the same :class:`~scriba.meta.records.Cookie` under
``cookie_key(bookie_id)``. Decision table at start (:func:`verify_or_create`):

- no cookie in the store, every dir empty or missing    -> new bookie: write dirs, then store
- no cookie in the store, dirs carry our cookie          -> finish an interrupted first start
- cookie in the store, every dir carries an equal cookie -> start
- anything else (a dir missing, wiped, holding another bookie's or instance's cookie,
  or non-empty without a cookie)                          -> CookieMismatchError naming the dir

:func:`format_bookie` re-initialises deliberately (``--force`` wipes non-empty dirs and
replaces the store's cookie).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from scriba.errors import CookieMismatchError, KeyExistsError, NoSuchKeyError
from scriba.ids import BookieId
from scriba.log import get_logger
from scriba.meta.records import Cookie, cookie_key
from scriba.meta.store import MetadataStore

log = get_logger(__name__)

COOKIE_FILE: Final = "COOKIE"
_FORMAT_HINT = "run `scriba bookie format --force` to re-initialise this bookie deliberately"


def read_dir_cookie(directory: Path) -> Cookie | None:
    """The cookie in ``directory`` (None if absent; CookieMismatchError if unreadable)."""
    path = Path(directory) / COOKIE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CookieMismatchError(f"{directory}: cannot read cookie: {exc}") from None
    try:
        return Cookie.from_bytes(data)
    except Exception as exc:
        raise CookieMismatchError(f"{directory}: cookie file is corrupt ({exc})") from None


def write_dir_cookie(directory: Path, cookie: Cookie) -> None:
    """Write the cookie durably (temp file, fsync, rename, fsync the dir)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (COOKIE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / COOKIE_FILE)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_empty(directory: Path) -> bool:
    try:
        return not any(Path(directory).iterdir())
    except FileNotFoundError:
        return True


def _exists(directory: Path) -> bool:
    return Path(directory).is_dir()


def _wipe(path: Path) -> None:
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _same(a: Cookie, b: Cookie) -> bool:
    return a.bookie_id == b.bookie_id and a.instance_id == b.instance_id


def new_cookie(bookie_id: str, dirs: Sequence[Path], ledger_dirs: Sequence[Path]) -> Cookie:
    return Cookie(
        bookie_id=BookieId(bookie_id),
        instance_id=uuid.uuid4().hex,
        journal_dirs=tuple(str(Path(d).resolve()) for d in dirs if Path(d) not in ledger_dirs)
        or tuple(str(Path(d).resolve()) for d in ledger_dirs),
        ledger_dirs=tuple(str(Path(d).resolve()) for d in ledger_dirs),
    )


async def _store_cookie(store: MetadataStore, bookie_id: str) -> Cookie | None:
    try:
        raw = await store.get(cookie_key(bookie_id))
    except NoSuchKeyError:
        return None
    return Cookie.from_bytes(raw.value)


async def verify_or_create(
    store: MetadataStore, bookie_id: str, dirs: Sequence[Path], ledger_dirs: Sequence[Path]
) -> Cookie:
    """Check (or, for a brand-new bookie, create) the cookies; CookieMismatchError on doubt."""
    stored = await _store_cookie(store, bookie_id)
    local = {Path(d): read_dir_cookie(Path(d)) for d in dirs}
    if stored is None:
        ours = [c for c in local.values() if c is not None]
        if not ours:
            for d in dirs:
                if not _is_empty(d):
                    raise CookieMismatchError(
                        f"{d}: not empty and has no cookie, and bookie {bookie_id} is new; "
                        f"use an empty directory or {_FORMAT_HINT}"
                    )
            cookie = new_cookie(bookie_id, dirs, ledger_dirs)
            for d in dirs:
                write_dir_cookie(d, cookie)
            await store.create(cookie_key(bookie_id), cookie.to_bytes())
            log.info("cookie_created", bookie_id=bookie_id, instance_id=cookie.instance_id)
            return cookie
        first = ours[0]
        for d, c in local.items():
            if c is None or not _same(c, first) or c.bookie_id != bookie_id:
                raise CookieMismatchError(
                    f"{d}: cookie {'missing' if c is None else c.instance_id} does not match "
                    f"the other dirs of bookie {bookie_id}; {_FORMAT_HINT}"
                )
        try:
            await store.create(cookie_key(bookie_id), first.to_bytes())
        except KeyExistsError:
            return await verify_or_create(store, bookie_id, dirs, ledger_dirs)
        log.info("cookie_restored_in_store", bookie_id=bookie_id, instance_id=first.instance_id)
        return first
    for d, c in local.items():
        if not _exists(d):
            raise CookieMismatchError(
                f"{d}: directory missing, but bookie {bookie_id} is registered with instance "
                f"{stored.instance_id}; {_FORMAT_HINT}"
            )
        if c is None:
            raise CookieMismatchError(
                f"{d}: no cookie (wiped or replaced disk?), but bookie {bookie_id} is registered "
                f"with instance {stored.instance_id}; {_FORMAT_HINT}"
            )
        if not _same(c, stored):
            raise CookieMismatchError(
                f"{d}: cookie of bookie {c.bookie_id} instance {c.instance_id} does not match "
                f"bookie {bookie_id} instance {stored.instance_id} (swapped disk?); {_FORMAT_HINT}"
            )
    return stored


async def format_bookie(
    store: MetadataStore,
    bookie_id: str,
    dirs: Sequence[Path],
    ledger_dirs: Sequence[Path],
    *,
    force: bool,
) -> Cookie:
    """Give the bookie a fresh instance: empty dirs and a new cookie in dirs and store."""
    key = cookie_key(bookie_id)
    try:
        existing = await store.get(key)
    except NoSuchKeyError:
        existing = None
    if not force:
        if existing is not None:
            raise CookieMismatchError(
                f"bookie {bookie_id} already has a cookie in the metadata store; use --force "
                "(its data on this machine is discarded)"
            )
        for d in dirs:
            if not _is_empty(d):
                raise CookieMismatchError(f"{d}: not empty; use --force to wipe it")
    for d in dirs:
        _wipe(Path(d))
    cookie = new_cookie(bookie_id, dirs, ledger_dirs)
    for d in dirs:
        write_dir_cookie(d, cookie)
    if existing is None:
        await store.create(key, cookie.to_bytes())
    else:
        await store.set(key, cookie.to_bytes(), expected_version=existing.version)
    log.info("bookie_formatted", bookie_id=bookie_id, instance_id=cookie.instance_id, force=force)
    return cookie
