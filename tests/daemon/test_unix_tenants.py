"""Tenants on the control socket: only the home's owner gets in, and it sees every session.

A caller's tenant on the Unix socket is its uid; the daemon serves the uid it runs as
(the home's owner), who sees all, and no other: the home is 0700 and the socket 0600,
and a peer of another uid that gets past them (an operator loosened the modes) is
closed at the accept, before a byte of it is read (SO_PEERCRED). Run as root, a forked
child made ``nobody`` tries both.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import Client, call
from tests.harness.support import log_user_keys, running_daemon
from worker.ipc.wire import encode

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as nobody"),
]

NOBODY = 65534


def _child(path: str, frames: bytes, out: int) -> None:
    """In a forked child made nobody: connect, send ``frames``, say what came back."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    try:
        sock.connect(path)
    except OSError as exc:
        os.write(out, f"connect {exc.errno}".encode())
        return
    try:
        sock.sendall(frames)
        data = sock.recv(1 << 16)
    except OSError as exc:
        os.write(out, f"io {exc.errno}".encode())
        return
    os.write(out, f"read {len(data)}".encode())


def as_nobody(home: Path, *messages: dict[str, object]) -> str:
    """What a process of uid nobody got for ``messages`` on the home's socket. A fork,
    not an interpreter: nobody may not run this machine's Python (under /root)."""
    frames = b"".join(encode(message) for message in messages)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 0
        try:
            _child(str(home / "loopd.sock"), frames, write_end)
        except BaseException:  # noqa: BLE001 (a forked child's one boundary: its exit code)
            code = 1
        os._exit(code)
    os.close(write_end)
    try:
        _pid, status = os.waitpid(pid, 0)
        answer = os.read(read_end, 256).decode()
    finally:
        os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0, answer
    return answer


@pytest.fixture
def home() -> Iterator[Path]:
    """A home under /tmp itself: its parent is traversable by nobody (pytest's is not)."""
    where = Path(tempfile.mkdtemp(prefix="loopd-uid-", dir="/tmp"))
    try:
        yield where / "home"
    finally:
        shutil.rmtree(where)


HOSTILE = (
    {"id": 1, "op": "status"},
    {"id": 2, "op": "send", "session": "s1", "text": "from nobody", "key": "n1"},
    {"id": 3, "op": "create", "session": "n2"},
)


def test_another_uid_cannot_reach_the_socket_of_a_home_it_may_not_enter(home: Path) -> None:
    with running_daemon(home):
        with Client(str(home)) as client:
            client.call("create", session="s1")
            client.send("s1", "hello", key="k1")
        home.parent.chmod(0o755)
        answer = as_nobody(home, *HOSTILE)
        assert answer == "connect 13", answer  # EACCES: the home is 0700
        assert log_user_keys(home, "s1") == ["k1"]


def test_another_uid_past_loosened_modes_is_closed_before_it_is_read(home: Path) -> None:
    with running_daemon(home):
        with Client(str(home)) as client:
            client.call("create", session="s1")
            client.send("s1", "hello", key="k1")
        home.parent.chmod(0o755)
        home.chmod(0o755)  # what an operator must not do: serve set it 0700
        (home / "loopd.sock").chmod(0o777)
        answer = as_nobody(home, *HOSTILE)
        assert answer in ("read 0", "io 104", "io 32"), answer  # closed: no reply at all
        assert log_user_keys(home, "s1") == ["k1"]
        rows = call(str(home), "status")  # the owner is served on, and sees every session
        assert isinstance(rows, list)
        assert [row["session"] for row in rows] == ["s1"]
