"""The lease deadline file a node publishes to its workers: fail-safe reading."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from worker import NotOwnerNow
from worker.ipc.lease_deadline import LeaseFence, lease_proven, read_deadline, write_deadline


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


def test_a_published_deadline_in_the_future_proves_the_lease(tmp_path: Path) -> None:
    fd = _open(tmp_path / "lease")
    try:
        write_deadline(fd, time.monotonic() + 5, str(tmp_path / "lease"))
        assert lease_proven(fd)
        write_deadline(fd, time.monotonic() - 0.001, str(tmp_path / "lease"))
        assert not lease_proven(fd)
    finally:
        os.close(fd)


def test_an_empty_file_proves_nothing(tmp_path: Path) -> None:
    fd = _open(tmp_path / "lease")
    try:
        assert read_deadline(fd) == 0.0
        assert not lease_proven(fd)
    finally:
        os.close(fd)


def test_a_half_written_value_reads_as_no_deadline(tmp_path: Path) -> None:
    fd = _open(tmp_path / "lease")
    try:
        future = time.monotonic() + 5
        os.pwrite(fd, struct.pack("<dqdq", future, 7, future - 1, 7), 0)
        assert read_deadline(fd) == 0.0
        assert not lease_proven(fd)
    finally:
        os.close(fd)


def test_the_fence_refuses_once_the_deadline_has_passed_or_the_lease_changed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lease"
    fd = _open(path)
    fence = LeaseFence(str(path), lease=0x1F)
    try:
        write_deadline(fd, time.monotonic() + 5, str(path), 0x1F)
        fence.check()
        write_deadline(fd, 0.0, str(path), 0x1F)
        with pytest.raises(NotOwnerNow, match="lease 1f is not proven within its renew deadline"):
            fence.check()
        write_deadline(fd, time.monotonic() + 5, str(path), 0x20)  # a new lease: new tokens
        with pytest.raises(NotOwnerNow):
            fence.check()
    finally:
        fence.close()
        os.close(fd)
