"""The disk fault layer's one-shot and partial-write faults (``scriba.testing.diskfaults``)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from scriba.testing.diskfaults import FaultyFileIO


def test_faults_max_makes_a_fault_one_shot_until_a_new_spec(tmp_path: Path) -> None:
    fio = FaultyFileIO({"fsync_eio": True, "faults_max": 1})
    fd = fio.open(tmp_path / "f")
    try:
        fio.write(fd, b"a")
        with pytest.raises(OSError, match="injected fsync_eio") as err:
            fio.fdatasync(fd)
        assert err.value.errno == errno.EIO
        fio.fdatasync(fd)  # spent: the next one succeeds
        fio.fdatasync(fd)
        assert fio.faults == [f"fsync_eio:{tmp_path / 'f'}"]
        assert fio.durable[str(tmp_path / "f")] == 1
        fio.set_spec({"fsync_eio": True, "faults_max": 2})  # a new spec re-arms
        for _ in range(2):
            with pytest.raises(OSError):
                fio.fdatasync(fd)
        fio.fdatasync(fd)
        fio.set_spec({"fsync_eio": True})  # without faults_max: every time
        for _ in range(3):
            with pytest.raises(OSError):
                fio.fdatasync(fd)
    finally:
        fio.close(fd)


def test_a_torn_write_leaves_a_prefix_then_raises(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fio = FaultyFileIO({"enospc": True})
    fd = fio.open(path)
    try:
        with pytest.raises(OSError):
            fio.write(fd, b"0123")
        assert path.read_bytes() == b""  # without torn_write_bytes a failed write leaves nothing
        fio.set_spec({"enospc": True, "torn_write_bytes": 4, "faults_max": 1})
        with pytest.raises(OSError, match="injected write_enospc") as err:
            fio.writev(fd, [b"0123", b"456789"])
        assert err.value.errno == errno.ENOSPC
        assert path.read_bytes() == b"0123"  # the short write reached the file
        fio.write(fd, b"xy")  # spent: writes go through again
        assert path.read_bytes() == b"0123xy"
        fio.set_spec({"eio_on_write": True, "torn_write_bytes": 100})
        with pytest.raises(OSError) as err:
            fio.write(fd, b"abc")
        assert err.value.errno == errno.EIO
        assert path.read_bytes() == b"0123xyab"  # never the whole write: all but one byte
        fio.set_spec({"write_bytes_max": fio.written_bytes + 3, "torn_write_bytes": 2})
        with pytest.raises(OSError):
            fio.write(fd, b"defg")
        assert path.read_bytes() == b"0123xyabde"
    finally:
        fio.close(fd)


def test_a_control_file_rewrite_re_arms_a_spent_fault(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"fsync_eio": True, "faults_max": 1, "path_contains": "jnl"}))
    fio = FaultyFileIO.from_spec(f"@{control}")
    jnl = fio.open(tmp_path / "a.jnl")
    other = fio.open(tmp_path / "b.elog")
    try:
        fio.fdatasync(other)  # another file: not touched, the fault is not spent
        with pytest.raises(OSError):
            fio.fdatasync(jnl)
        fio.fdatasync(jnl)
        control.write_text(json.dumps({"fsync_eio": True, "faults_max": 1, "path_contains": "jnl"}))
        os.utime(control, ns=(1, 1))  # a new mtime even within the clock's granularity
        with pytest.raises(OSError):
            fio.fdatasync(jnl)
        fio.fdatasync(jnl)
        assert len(fio.faults) == 2
    finally:
        fio.close(jnl)
        fio.close(other)
