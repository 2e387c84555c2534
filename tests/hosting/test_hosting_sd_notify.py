"""sd_notify: datagrams received on a real Unix datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.hosting.sd_notify import Notifier


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5.0)
    yield path, sock
    sock.close()


def test_ready_and_status_arrive_as_one_datagram_of_key_value_lines(
    manager: tuple[str, socket.socket],
) -> None:
    path, sock = manager
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": path})
    notifier.ready("serving 3 sessions")
    notifier.stopping("stopping\nworkers")
    notifier.close()
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving 3 sessions\n"
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping workers\n"


def test_an_abstract_socket_address_is_reached_through_its_leading_at() -> None:
    name = f"loopd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5.0)
        notifier = Notifier.from_environ({"NOTIFY_SOCKET": "@" + name})
        notifier.watchdog()
        notifier.close()
        assert sock.recv(4096) == b"WATCHDOG=1\n"


def test_without_notify_socket_nothing_is_sent_and_there_is_no_watchdog() -> None:
    notifier = Notifier.from_environ({"WATCHDOG_USEC": "1000000"})
    assert not notifier.send(READY="1")
    assert notifier.watchdog_interval() is None


def test_the_watchdog_pings_at_half_the_timeout_only_for_the_named_pid(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.sock")
    mine = Notifier.from_environ(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert mine.watchdog_interval() == 1.5
    other = Notifier.from_environ(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "1"}
    )
    assert other.watchdog_interval() is None


def test_a_manager_that_is_gone_loses_the_message_without_an_error(tmp_path: Path) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert not notifier.ready("ready")
    notifier.close()
