"""The size-capped tmpfs (root only) gives a real ENOSPC and cleans up after itself."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from scriba.testing.tmpfs import is_mounted, size_capped_tmpfs, unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_tmpfs_fills_up_with_enospc_and_unmounts(tmp_path: Path) -> None:
    with size_capped_tmpfs(256 * 1024, parent=tmp_path) as mount:
        assert is_mounted(mount)
        written = 0
        with pytest.raises(OSError) as info, open(mount / "fill", "wb") as f:
            for _ in range(1000):  # far more than fits: bounded loop
                f.write(b"x" * 4096)
                f.flush()
                os.fsync(f.fileno())
                written += 4096
        assert info.value.errno == errno.ENOSPC
        assert 128 * 1024 <= written <= 256 * 1024
        usage = os.statvfs(mount)
        assert usage.f_bavail == 0
        (mount / "fill").unlink()  # space comes back
        (mount / "small").write_bytes(b"ok")
    assert not is_mounted(mount)
    assert not mount.exists()


def test_tmpfs_unmounts_even_when_a_file_is_open(tmp_path: Path) -> None:
    with size_capped_tmpfs(64 * 1024, parent=tmp_path) as mount:
        held = open(mount / "held", "wb")  # kept open across the unmount on purpose
    try:
        assert not is_mounted(mount)
        assert not mount.exists()
    finally:
        held.close()
