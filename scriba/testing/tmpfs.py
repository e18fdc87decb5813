"""A size-capped tmpfs mount (root only): a real ENOSPC for disk-full tests.

:func:`size_capped_tmpfs` mounts a fresh tmpfs of ``size_bytes`` on a new
temporary directory, yields its path and, on exit, unmounts it (lazily if a
process still holds it open) and removes the directory. :func:`unavailable_reason`
says why it cannot be used here (tests skip with that text).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scriba.errors import ScribaError
from scriba.invariant import invariant

MOUNT_TIMEOUT_S = 10.0
SIZE_BYTES_MAX = 4 * 1024**3


class TmpfsUnavailableError(ScribaError):
    """A tmpfs cannot be mounted here (not root, or mount failed)."""


def unavailable_reason() -> str | None:
    """Why a tmpfs cannot be mounted here, or None if it can."""
    if os.geteuid() != 0:
        return "mounting a size-capped tmpfs needs root: run the disk-full tests as root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "`mount`/`umount` are not installed"
    return None


@contextlib.contextmanager
def size_capped_tmpfs(size_bytes: int, *, parent: Path | None = None) -> Iterator[Path]:
    """Mount a tmpfs of ``size_bytes`` (rounded up to whole pages by the kernel); yield its path."""
    invariant(0 < size_bytes <= SIZE_BYTES_MAX, f"size_bytes must be in (0, {SIZE_BYTES_MAX}]")
    reason = unavailable_reason()
    if reason is not None:
        raise TmpfsUnavailableError(reason)
    mount_point = Path(tempfile.mkdtemp(prefix="scriba-tmpfs-", dir=parent))
    try:
        _run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(mount_point)])
    except BaseException:
        mount_point.rmdir()
        raise
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=MOUNT_TIMEOUT_S).returncode != 0:
            _run(["umount", "-l", str(mount_point)])  # busy: detach now, freed when the last user closes
        mount_point.rmdir()


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    if done.returncode != 0:
        raise TmpfsUnavailableError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


__all__ = ["TmpfsUnavailableError", "is_mounted", "size_capped_tmpfs", "unavailable_reason"]
