"""The file layer under the journal and entry logs: plain POSIX calls on file descriptors.

Everything that touches journal or entry-log bytes goes through a :class:`FileIO`, so a
test can swap in ``scriba.testing.diskfaults.FaultyFileIO`` (EIO on fsync or write, ENOSPC,
dropping bytes not yet fsynced on a simulated crash). :func:`default_fileio` picks the
faulty one in a process whose environment sets ``SCRIBA_DISK_FAULTS``.

Contract: ``write``/``writev`` write everything or raise ``OSError`` — possibly after a
prefix of the data reached the file (a short write, then ENOSPC): callers cut the file
back before writing on. ``fdatasync`` raising means the bytes since the last successful
sync may be lost — callers never retry and acknowledge. ``extend`` grows a file without
moving its position (the journal's preallocation); a layer may make it do nothing, so
callers use it for speed only, never rely on the size. ``drop_cache`` is advice (the
kernel may drop those cached pages; dirty ones are written first): never a loss, never
an error.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

DISK_FAULTS_ENV = "SCRIBA_DISK_FAULTS"
IOV_MAX = 1024


class FileIO(Protocol):
    def open(self, path: Path, *, create: bool = True) -> int: ...
    def write(self, fd: int, data: bytes | memoryview) -> None: ...
    def writev(self, fd: int, parts: list[bytes]) -> None: ...
    def pread(self, fd: int, length: int, offset: int) -> bytes: ...
    def extend(self, fd: int, size: int) -> None: ...
    def fdatasync(self, fd: int) -> None: ...
    def drop_cache(self, fd: int, offset: int, length: int) -> None: ...
    def truncate(self, fd: int, length: int) -> None: ...
    def size(self, fd: int) -> int: ...
    def close(self, fd: int) -> None: ...
    def fsync_dir(self, path: Path) -> None: ...
    def remove(self, path: Path) -> None: ...


class OsFileIO:
    """The real thing: ``os.open``/``os.write``/``os.pread``/``os.fdatasync``."""

    def open(self, path: Path, *, create: bool = True) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o644)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(f"short write of {len(view)} bytes")
            view = view[n:]

    def writev(self, fd: int, parts: list[bytes]) -> None:
        """Write the parts in order, all of them (no join copy; IOV_MAX per call)."""
        for i in range(0, len(parts), IOV_MAX):
            chunk = parts[i : i + IOV_MAX]
            n = os.writev(fd, chunk)
            expect = sum(map(len, chunk))
            if n < expect:  # partial write: finish the rest plainly
                self.write(fd, memoryview(b"".join(chunk))[n:])

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def extend(self, fd: int, size: int) -> None:
        """Grow the file to ``size`` bytes (the new ones read as zeros: a hole, no data written)."""
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def drop_cache(self, fd: int, offset: int, length: int) -> None:
        """``posix_fadvise(DONTNEED)`` on the range (``length`` 0: to the end); advice only."""
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)
        os.lseek(fd, length, os.SEEK_SET)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: Path) -> None:
        os.unlink(path)


def default_fileio() -> FileIO:
    """OsFileIO, or the fault-injecting layer when ``SCRIBA_DISK_FAULTS`` is set."""
    spec = os.environ.get(DISK_FAULTS_ENV, "")
    if spec:
        from scriba.testing.diskfaults import FaultyFileIO

        return FaultyFileIO.from_spec(spec)
    return OsFileIO()
