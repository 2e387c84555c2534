"""The control socket: its mode, bad frames, status, stop and start, peers of another uid."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import msgpack
import psutil
import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from tests.harness.support import loopd, running_daemon, status, wait_state
from worker import Session
from worker.app import DefaultApp


def _raw(home: Path, payload: bytes) -> object:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(home / SOCKET_NAME))
        # The daemon may answer an oversized frame and close before reading all of it.
        with contextlib.suppress(BrokenPipeError):
            sock.sendall(payload)
        data = sock.recv(65536)
    return msgpack.unpackb(data, raw=False) if data else None


def test_the_control_socket_is_0600_and_bad_frames_leave_the_daemon_serving(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        mode = stat.S_IMODE(os.stat(home / SOCKET_NAME).st_mode)
        assert mode == 0o600
        garbage = _raw(home, b"\xc1\xc1\xc1 not msgpack")
        assert isinstance(garbage, dict)
        assert garbage["error"]["code"] == "bad_frame"
        oversized = _raw(home, msgpack.packb({"id": 1, "op": "send", "text": "x" * (2 << 20)}))
        assert isinstance(oversized, dict)
        assert "size limit" in oversized["error"]["message"]
        not_a_map = _raw(home, msgpack.packb([1, 2, 3]))
        assert isinstance(not_a_map, dict)
        assert not_a_map["ok"] is False
        ill_typed = _raw(home, msgpack.packb({"id": 7, "op": "send", "session": 5, "text": 1}))
        assert ill_typed == {
            "id": 7,
            "ok": False,
            "error": {"code": "bad_request", "message": "field 'session' must be str, got int"},
        }
        unknown = _raw(home, msgpack.packb({"id": 8, "op": "explode"}))
        assert isinstance(unknown, dict)
        assert unknown["error"]["code"] == "bad_request"
        bad_id = _raw(home, msgpack.packb({"id": 9, "op": "send", "session": "../x", "text": "t"}))
        assert isinstance(bad_id, dict)
        assert "invalid session id" in bad_id["error"]["message"]
        assert call(str(home), "ping")


def test_status_json_lists_every_session_with_the_documented_keys(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="b")
        call(str(home), "create", session="a")
        call(str(home), "send", session="a", text="hi")
        shown = loopd("status", "--home", str(home), "--json")
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        assert [r["session"] for r in rows] == ["a", "b"]
        for row in rows:
            assert set(row) >= {
                "session",
                "state",
                "pid",
                "epoch",
                "records",
                "restarts",
                "uptime_s",
                "rss_bytes",
                "last_error",
            }
            assert row["state"] == "RUNNING"
            assert isinstance(row["pid"], int)
            assert row["rss_bytes"] > 0
            assert row["cpu_s"] >= 0
        assert rows[0]["records"] == 5
        table = loopd("status", "--home", str(home))
        assert table.stdout.splitlines()[0].split()[:3] == ["session", "state", "pid"]


def test_stop_start_and_restart_move_the_session_through_its_states(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        first = status(home, "s1")["pid"]
        assert psutil.Process(int(str(first))).name() == "loopd:s1"  # what ps and pgrep show
        stopped = call(str(home), "stop", session="s1")
        assert isinstance(stopped, dict)
        assert stopped["state"] == "STOPPED"
        assert (
            not psutil.pid_exists(int(str(first)))
            or psutil.Process(int(str(first))).status() == psutil.STATUS_ZOMBIE
        )
        with pytest.raises(ControlError, match="STOPPED"):
            call(str(home), "send", session="s1", text="x")
        started = call(str(home), "start", session="s1")
        assert isinstance(started, dict)
        assert started["state"] == "RUNNING"
        restarted = call(str(home), "restart", session="s1")
        assert isinstance(restarted, dict)
        assert restarted["state"] == "RUNNING"
        assert restarted["pid"] not in (first, started["pid"])
        compacted = call(str(home), "compact", session="s1", summary="by hand")
        assert isinstance(compacted, dict)
        assert compacted["state"]["epoch"] == 1
    with Session.open(home, "s1") as session:
        assert session.carry == "by hand"


PEER = """
import os, socket, sys
import msgpack  # before dropping root: the interpreter's files may be root's alone
os.setgid(65534)
os.setuid(65534)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(sys.argv[1])
try:
    sock.sendall(msgpack.packb({"id": 1, "op": "ping"}))
    data = sock.recv(65536)
except OSError:
    data = b""
print("closed" if not data else "answered")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_a_peer_of_another_uid_is_refused_even_when_the_socket_mode_would_let_it_in(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        path = home / SOCKET_NAME
        # Open the way past the file modes on purpose, so only SO_PEERCRED stands guard;
        # the modes are put back afterwards.
        opened = [home, *[p for p in (tmp_path, *tmp_path.parents) if p != Path("/")]]
        modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in opened}
        try:
            os.chmod(path, 0o666)  # noqa: S103 - the point of the test
            for directory in opened:
                os.chmod(directory, modes[directory] | 0o001)
            peer = subprocess.run(
                [sys.executable, "-c", PEER, str(path)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        finally:
            for directory, mode in modes.items():
                os.chmod(directory, mode)
        assert peer.stdout.strip() == "closed", peer.stderr
        assert call(str(home), "ping")


def test_a_session_held_by_another_process_goes_fatal_naming_the_holder_without_a_fight(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, "held", DefaultApp().initial_baseline("held")).close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom worker import Session\ns = Session.open(sys.argv[1], 'held')\n"
         "print('holding', flush=True)\nsys.stdin.read()", str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"holding\n"
        with running_daemon(home) as daemon:
            row = wait_state(home, "held", "FATAL")
            assert f"locked by process {holder.pid}" in str(row["last_error"])
            assert "not fighting it" in str(row["last_error"])
            assert row["restarts"] == 0
            assert daemon.workers() == []
            assert holder.poll() is None  # the holder was left alone
    finally:
        holder.kill()
        holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
