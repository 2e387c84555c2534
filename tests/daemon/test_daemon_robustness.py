"""One client or one worker cannot crash, stall or deadlock the daemon (real sockets, signals)."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import psutil
import pytest
from click.testing import CliRunner

from supervisor.cli.serve_command import serve
from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from tests.harness.support import REPO, loopd, poll_until, running_daemon, status, stop, wait_state
from worker.ipc.wire import MAX_FRAME


def _connect(home: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(home / SOCKET_NAME))
    return sock


def _frame(message: dict[str, object]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def _answers_quickly(home: Path, within: float = 3.0) -> bool:
    started = time.monotonic()
    call(str(home), "ping", timeout=within)
    return time.monotonic() - started < within


def test_clients_that_vanish_while_a_large_reply_is_written_leave_the_daemon_serving(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        big = "x" * 600_000
        for n in range(6):
            sock = _connect(home)
            sock.sendall(_frame({"id": n, "op": "send", "session": "s1", "text": big}))
            sock.close()  # gone before the ~600 KB reply is written
            # A new connection takes the closed one's fd number.
            assert call(str(home), "ping")
        assert daemon.proc.poll() is None
        assert status(home, "s1")["state"] == "RUNNING"


def test_two_concurrent_large_sends_to_one_session_both_complete_and_sigterm_still_works(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        results: list[object] = []

        def send(n: int) -> None:
            try:
                reply = call(str(home), "send", session="s1", text=str(n) * 300_000, timeout=20)
            except ControlError as exc:
                reply = exc
            results.append(reply)

        senders = [threading.Thread(target=send, args=(n,)) for n in range(3)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=30)
        assert all(isinstance(r, dict) for r in results), results
        assert len(results) == 3
        assert daemon.stop() == 0


def test_a_sigstopped_worker_is_killed_after_the_hang_timeout_and_restarted(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--hang-timeout", "1") as daemon:
        call(str(home), "create", session="s1")
        call(str(home), "create", session="s2")
        first = status(home, "s1")["pid"]
        assert isinstance(first, int)
        stop(first)
        # Large requests queued to the stopped worker must not block the daemon's loop.
        outcomes: list[object] = []

        def send() -> None:
            try:
                outcomes.append(call(str(home), "send", session="s1", text="y" * 400_000, key="q"))
            except ControlError as exc:
                outcomes.append(exc)

        senders = [threading.Thread(target=send) for _ in range(3)]
        for sender in senders:
            sender.start()
        assert _answers_quickly(home)
        assert call(str(home), "send", session="s2", text="still served", timeout=5)

        def restarted() -> dict[str, object] | None:
            row = status(home, "s1")
            return row if row["state"] == "RUNNING" and row["pid"] != first else None

        row = poll_until(restarted, what="the hung worker to be replaced")
        assert row["restarts"] == 1
        assert "hang" in str(row["last_error"])
        for sender in senders:
            sender.join(timeout=30)
        assert len(outcomes) == 3
        for outcome in outcomes:
            assert isinstance(outcome, dict | ControlError)
            assert isinstance(outcome, dict) or outcome.code == "worker_died", outcome
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"
        assert daemon.proc.poll() is None


def _lower_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))


def test_a_daemon_out_of_file_descriptors_keeps_running_and_serves_once_clients_leave(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_lower_fd_limit,  # noqa: PLW1509 - only setrlimit, before exec
    )
    idle: list[socket.socket] = []
    try:
        poll_until((home / SOCKET_NAME).exists, what="the socket")
        call(str(home), "ping")
        for _ in range(80):
            with contextlib.suppress(OSError):
                idle.append(_connect(home))
        poll_until(
            lambda: (
                len(psutil.Process(proc.pid).open_files()) >= 0
                and proc.poll() is None
                and psutil.Process(proc.pid).num_fds() >= 46
            ),
            what="the daemon to run out of descriptors",
        )
        assert proc.poll() is None
        for sock in idle:
            sock.close()
        idle.clear()
        poll_until(lambda: _ping_ok(home), what="the daemon to serve again")
        assert proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert b"Traceback" not in out
    assert b"too many open files" in out.lower()


def _ping_ok(home: Path) -> bool:
    try:
        call(str(home), "ping", timeout=2)
    except ControlError:
        return False
    return True


def test_clients_that_pipeline_and_never_read_do_not_stall_the_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        greedy = []
        try:
            for n in range(4):
                sock = _connect(home)
                sock.setblocking(False)
                frame = _frame({"id": n, "op": "status"}) * 20_000
                with contextlib.suppress(BlockingIOError):
                    while frame:
                        frame = frame[sock.send(frame) :]
                greedy.append(sock)
            # A stall would last as long as the greedy clients stay connected, unread: a
            # bound well above a loaded machine's slowest answer still catches it.
            for _ in range(5):
                assert _answers_quickly(home, within=15.0)
        finally:
            for sock in greedy:
                sock.close()
        assert _answers_quickly(home)


def test_a_request_refused_before_forwarding_gets_exactly_one_reply(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        pid = status(home, "s1")["pid"]
        assert isinstance(pid, int)
        sock = _connect(home)
        unpacker = msgpack.Unpacker(raw=False)
        try:
            # Exactly the frame limit itself, so one byte over it once wrapped to be forwarded.
            request: dict[str, object] = {"id": 1, "op": "send", "session": "s1", "text": ""}
            request["text"] = "z" * (MAX_FRAME - len(_frame(request)) - 4)
            assert len(_frame(request)) == MAX_FRAME
            sock.sendall(_frame(request))
            first = _next_message(sock, unpacker)
            assert first["id"] == 1
            assert first["ok"] is False
            os.kill(pid, signal.SIGKILL)
            wait_state(home, "s1", "RUNNING", restarts=1)
            sock.sendall(_frame({"id": 2, "op": "ping"}))
            second = _next_message(sock, unpacker)
            assert second["id"] == 2, second
        finally:
            sock.close()


def _next_message(sock: socket.socket, unpacker: msgpack.Unpacker) -> dict[str, object]:
    while True:
        for message in unpacker:
            assert isinstance(message, dict)
            return message
        data = sock.recv(65536)
        assert data, "closed without a reply"
        unpacker.feed(data)


def test_under_umask_000_the_home_and_its_new_parents_are_0700(tmp_path: Path) -> None:
    home = tmp_path / "a" / "b" / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: os.umask(0),  # noqa: PLW1509 - only the umask, before exec
    )
    try:
        poll_until((home / SOCKET_NAME).exists, what="the socket")
        for directory in (tmp_path / "a", tmp_path / "a" / "b", home, home / "sessions"):
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
        assert stat.S_IMODE(os.stat(home / SOCKET_NAME).st_mode) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


FORGER = """
import os, socket, sys
import msgpack
path, said = sys.argv[1], sys.argv[2]
os.setgid(65534)
os.setuid(65534)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(4)
print("listening", flush=True)
server.settimeout(20)
while True:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        sys.exit(0)
    conn.settimeout(5)
    try:
        data = conn.recv(65536)
        conn.sendall(msgpack.packb({"id": 1, "ok": True, "result": {"forged": True}}))
    except OSError:
        data = b""
    with open(said, "ab") as f:
        f.write(data)
    conn.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
@pytest.mark.parametrize(
    "socket_owner", ["theirs", "chowned-to-us"], ids=["socket-file-theirs", "only-peer-theirs"]
)
def test_the_client_refuses_a_socket_served_by_another_uid_and_sends_it_nothing(
    tmp_path: Path, socket_owner: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)  # noqa: S103 - the careless setup the check must survive
    # The forger (uid 65534) must reach the home; the modes are put back afterwards.
    opened = [p for p in (tmp_path, *tmp_path.parents) if p != Path("/")]
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in opened}
    for directory in opened:
        os.chmod(directory, modes[directory] | 0o001)
    said = home / "said"
    forger = subprocess.Popen(
        [sys.executable, "-c", FORGER, str(home / SOCKET_NAME), str(said)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert forger.stdout is not None
        assert forger.stdout.readline() == "listening\n"
        if socket_owner == "chowned-to-us":
            # The file now passes for ours: only SO_PEERCRED can tell who serves it.
            os.chown(home / SOCKET_NAME, os.getuid(), os.getgid())
        with pytest.raises(ControlError, match="uid 65534"):
            call(str(home), "send", session="s1", text="the operator's secret", timeout=5)
        sent = loopd("send", "--home", str(home), "s1", "the operator's secret")
        assert sent.returncode != 0
        assert "Traceback" not in sent.stderr
        assert "not_ours" in sent.stderr
    finally:
        forger.kill()
        forger.wait()
        if forger.stdout is not None:
            forger.stdout.close()
        for directory, mode in modes.items():
            os.chmod(directory, mode)
    assert not said.exists() or b"secret" not in said.read_bytes()


@pytest.mark.parametrize(
    "setup",
    ["long-path", "socket-is-a-directory", "cannot-create-the-home"],
)
def test_serve_refuses_an_unusable_home_in_one_line_without_a_traceback(
    tmp_path: Path, setup: str
) -> None:
    if setup == "long-path":
        home = tmp_path / ("h" * 60) / ("o" * 60) / "home"
    elif setup == "socket-is-a-directory":
        home = tmp_path / "home"
        (home / SOCKET_NAME).mkdir(parents=True)
    else:
        home = Path("/proc") / f"loopd-{tmp_path.name}"  # no one may create it, not even root
    served = loopd("serve", "--home", str(home))
    assert served.returncode != 0
    assert "Traceback" not in served.stderr
    assert len(served.stderr.strip().splitlines()) == 1, served.stderr
    assert str(home) in served.stderr or SOCKET_NAME in served.stderr


def test_commands_to_a_hung_daemon_end_in_one_line_after_the_timeout(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        stop(daemon.proc)
        try:
            ran = [
                loopd(*command, "--home", str(home), "--timeout", "1")
                for command in (("send", "s1", "x"), ("stop", "s1"), ("status",))
            ]
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        for done in ran:
            assert done.returncode != 0
            assert "Traceback" not in done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
            assert "did not answer within 1" in done.stderr


def test_serve_on_a_file_system_that_cannot_hold_a_socket_refuses_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    real_bind = socket.socket.bind

    def bind(self: socket.socket, address: object) -> None:
        # What a FUSE mount without socket support answers, for the control socket only.
        if address in (str(home / SOCKET_NAME), str(home / SOCKET_NAME) + ".new"):
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
        real_bind(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "bind", bind)
    result = CliRunner().invoke(serve, ["--home", str(home)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.strip().splitlines() == [
        f"loopd serve: {home / SOCKET_NAME}: cannot create the control socket: "
        f"{os.strerror(errno.ENOSYS)}; the home must be on a local file system that holds "
        "Unix sockets and be writable by you"
    ]
