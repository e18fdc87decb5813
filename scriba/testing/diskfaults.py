"""A fault-injecting file layer for the bookie (``scriba.bookie.fileio.FileIO``).

Selected in a bookie process by ``SCRIBA_DISK_FAULTS`` (``fileio.default_fileio``) or
passed directly to ``open_storage(config, fileio=...)`` in-process. The spec is JSON, a
bare keyword, or ``@/path/to/control.json`` (a control file re-read whenever it changes,
so a test can turn faults on at run time). Keys:

- ``fsync_eio_after``: N -> every fdatasync after the first N successful ones raises EIO
- ``fsync_eio``: true -> every fdatasync raises EIO
- ``eio_on_write``: true -> writes raise EIO;  ``enospc``: true -> writes raise ENOSPC
- ``write_bytes_max``: N -> writes raise ENOSPC once N bytes were written in total
- ``skip_fsync``: true -> fdatasync does nothing (a NEGATIVE CONTROL: acks before durability)
- ``torn_write_bytes``: N -> a write that meets a write fault first writes its first N
  bytes (at most all but one): a partial write, then the error (ENOSPC after a short write)
- ``faults_max``: N -> at most N faults under this spec, then every call passes through
  until a new spec is set (1: a one-shot fault, e.g. one fdatasync EIO and the next
  succeeds -- a rule that holds only while a fault lasts is caught by this)
- ``path_contains``: "jnl" -> faults apply only to files whose path contains this
- ``crash_state``: path -> after every sync, the durable size of each file is written there
  (JSON), so :func:`apply_crash_state` can drop unsynced bytes after a SIGKILL.

:meth:`FaultyFileIO.simulate_crash` (in-process) and :func:`apply_crash_state` (after a
child was killed) cut every file back to its last fdatasync'd size, optionally keeping a
torn prefix of the unsynced bytes cut at a ``tear_bytes`` boundary (512 or 4096).
:func:`flip_bit` / :func:`flip_random_bits` corrupt files at rest.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

from scriba.bookie.fileio import OsFileIO

__all__ = ["FaultyFileIO", "apply_crash_state", "flip_bit", "flip_random_bits"]


def parse_spec(text: str) -> tuple[dict[str, Any], Path | None]:
    text = text.strip()
    if text.startswith("@"):
        return {}, Path(text[1:])
    if text.startswith("{"):
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError(f"SCRIBA_DISK_FAULTS: expected a JSON object, got {text!r}")
        return spec, None
    return {word: True for word in text.replace(",", " ").split()}, None


class FaultyFileIO(OsFileIO):
    def __init__(self, spec: dict[str, Any] | None = None, control_file: Path | None = None) -> None:
        self._spec: dict[str, Any] = dict(spec or {})
        self._control = control_file
        self._control_mtime = -1
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}
        self.durable: dict[str, int] = {}  # path -> size at the last successful fdatasync
        self.syncs = 0
        self.written_bytes = 0
        self.faults: list[str] = []  # every fault injected, as "kind:path"
        self._spent = 0  # faults injected under the current spec (for faults_max)
        self._reload()

    @classmethod
    def from_spec(cls, text: str) -> FaultyFileIO:
        spec, control = parse_spec(text)
        return cls(spec, control)

    def set_spec(self, spec: dict[str, Any]) -> None:
        with self._lock:
            self._spec = dict(spec)
            self._spent = 0

    def _reload(self) -> None:
        if self._control is None:
            return
        try:
            mtime = self._control.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime != self._control_mtime:
            self._control_mtime = mtime
            try:
                spec = json.loads(self._control.read_text() or "{}")
            except ValueError:
                return  # being rewritten; keep the previous spec
            with self._lock:
                self._spec = spec if isinstance(spec, dict) else {}
                self._spent = 0

    def _applies(self, fd: int) -> bool:
        want = self._spec.get("path_contains")
        return not want or want in self._paths.get(fd, "")

    def _take(self, kind: str, fd: int) -> bool:
        """Inject one fault of ``kind`` unless the spec's ``faults_max`` is spent."""
        with self._lock:
            budget = self._spec.get("faults_max")
            if budget is not None and self._spent >= int(budget):
                return False
            self._spent += 1
            self.faults.append(f"{kind}:{self._paths.get(fd, fd)}")
            return True

    def _write_fault(self, fd: int, nbytes: int) -> tuple[str, int] | None:
        """The fault a write of ``nbytes`` meets under the spec: (kind, errno) or None."""
        spec = self._spec
        if not self._applies(fd):
            return None
        cap = spec.get("write_bytes_max")
        if spec.get("eio_on_write"):
            kind, code = "write_eio", errno.EIO
        elif spec.get("enospc") or (cap is not None and self.written_bytes + nbytes > int(cap)):
            kind, code = "write_enospc", errno.ENOSPC
        else:
            return None
        return (kind, code) if self._take(kind, fd) else None

    # --- FileIO -----------------------------------------------------------------------

    def open(self, path: Path, *, create: bool = True) -> int:
        fd = super().open(path, create=create)
        key = str(path)
        with self._lock:
            self._paths[fd] = key
            if key not in self.durable:
                self.durable[key] = os.fstat(fd).st_size  # what exists at open counts as durable
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> None:
        self._reload()
        fault = self._write_fault(fd, len(data))
        if fault is not None:
            kind, code = fault
            torn = min(int(self._spec.get("torn_write_bytes") or 0), len(data) - 1)
            if torn > 0:  # a short write: part of the data reached the file
                super().write(fd, memoryview(data)[:torn])
                self.written_bytes += torn
            raise OSError(code, f"injected {kind}: {os.strerror(code)}")
        super().write(fd, data)
        self.written_bytes += len(data)

    def writev(self, fd: int, parts: list[bytes]) -> None:
        self.write(fd, b"".join(parts))  # one path for every fault

    def extend(self, fd: int, size: int) -> None:
        """Nothing: the crash model cuts a file back to its size at the last sync, which
        holds for appends only, so this layer never grows a file ahead of its writes."""

    def fdatasync(self, fd: int) -> None:
        self._reload()
        spec = self._spec
        if self._applies(fd):
            after = spec.get("fsync_eio_after")
            if (spec.get("fsync_eio") or (after is not None and self.syncs >= int(after))) and self._take(
                "fsync_eio", fd
            ):
                raise OSError(errno.EIO, f"injected fsync_eio: {os.strerror(errno.EIO)}")
            if spec.get("skip_fsync") and self._take("skip_fsync", fd):
                self.syncs += 1
                return
        super().fdatasync(fd)
        with self._lock:
            self.syncs += 1
            key = self._paths.get(fd)
            if key is not None:
                self.durable[key] = os.fstat(fd).st_size
        self._save_crash_state()

    def truncate(self, fd: int, length: int) -> None:
        super().truncate(fd, length)
        key = self._paths.get(fd)
        if key is not None:
            with self._lock:
                self.durable[key] = min(self.durable.get(key, length), length)

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def remove(self, path: Path) -> None:
        super().remove(path)
        with self._lock:
            self.durable.pop(str(path), None)
        self._save_crash_state()

    def _save_crash_state(self) -> None:
        target = self._spec.get("crash_state")
        if not target:
            return
        with self._lock:
            text = json.dumps(self.durable)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, target)

    # --- crashes ------------------------------------------------------------------------

    def crash_point(self) -> dict[str, int]:
        """The durable size of every file now: pass it to :meth:`simulate_crash` later."""
        with self._lock:
            return dict(self.durable)

    def simulate_crash(
        self, *, tear_bytes: int | None = None, seed: int = 0, point: dict[str, int] | None = None
    ) -> dict[str, int]:
        """Cut every file this layer wrote back to its durable size (at ``point`` if given)."""
        now = self.crash_point()
        # a file created after the crash point did not durably exist: cut it to nothing
        durable = now if point is None else {p: point.get(p, 0) for p in {*now, *point}}
        return _cut_files(durable, tear_bytes, random.Random(seed))


def _cut_files(durable: dict[str, int], tear_bytes: int | None, rng: random.Random) -> dict[str, int]:
    dropped: dict[str, int] = {}
    for path, keep in durable.items():
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        if size <= keep:
            continue
        new_size = keep
        if tear_bytes:
            # keep a torn prefix of the unsynced tail, cut at a sector/page boundary
            first = (keep // tear_bytes + 1) * tear_bytes
            bounds = list(range(first, size, tear_bytes))
            if bounds:
                new_size = rng.choice([keep, *bounds])
        os.truncate(path, new_size)
        dropped[path] = size - new_size
    return dropped


def apply_crash_state(state_file: Path, *, tear_bytes: int | None = None, seed: int = 0) -> dict[str, int]:
    """After SIGKILL of a process run with ``crash_state``: drop its unsynced bytes."""
    durable = json.loads(Path(state_file).read_text())
    return _cut_files(durable, tear_bytes, random.Random(seed))


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Flip one bit of a file at rest."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        if len(byte) != 1:
            raise ValueError(f"{path}: offset {offset} is past the end")
        f.seek(offset)
        f.write(bytes([byte[0] ^ (1 << bit)]))


def flip_random_bits(
    path: Path, count: int, rng: random.Random, start: int = 0, end: int | None = None
) -> list[int]:
    """Flip ``count`` random bits in ``[start, end)``; the offsets flipped."""
    size = os.path.getsize(path)
    stop = size if end is None else min(end, size)
    offsets = [rng.randrange(start, stop) for _ in range(count)]
    for off in offsets:
        flip_bit(path, off, rng.randrange(8))
    return offsets
