"""When ``loopd serve --http`` opens its HTTP port: only once its control socket listens."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from supervisor.control_socket import SOCKET_NAME
from tests.harness.etcd_server import free_port
from tests.harness.support import Daemon, loopd

CREATE = (
    b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    b'Content-Type: application/json\r\nContent-Length: 11\r\n\r\n{"id": "s"}'
)


class HttpFirstDaemon(Daemon):
    """A serve taken as started the moment its HTTP port accepts a TCP connection (its
    control socket listens a second late: ``tests.programs.serve_slow_listen``); that connection
    is kept in ``first``."""

    def __init__(self, home: Path, port: int) -> None:
        self.port = port
        self.first: socket.socket | None = None
        args = ("--http", f"127.0.0.1:{port}")
        super().__init__(home, *args, module="tests.programs.serve_slow_listen")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            out = self.log_path.read_text(errors="replace")
            raise AssertionError(f"serve exited with {self.proc.returncode}: {out}")
        try:
            self.first = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        except ConnectionRefusedError:
            return False
        return True


def _answer(sock: socket.socket, request: bytes) -> tuple[int, dict[str, object]]:
    with sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    document = json.loads(body)
    assert isinstance(document, dict), data
    return int(head.split()[1]), document


@pytest.mark.timeout(60)
def test_a_create_sent_the_moment_the_http_port_accepts_is_not_refused_no_daemon(
    tmp_path: Path,
) -> None:
    daemon = HttpFirstDaemon(tmp_path / "home", free_port())
    try:
        assert daemon.first is not None
        status, answer = _answer(daemon.first, CREATE)
        assert status != 503, answer
        assert (status, answer["session"], answer["state"]) == (201, "s", "RUNNING"), answer
    finally:
        assert daemon.stop() == 0


@pytest.mark.timeout(60)
def test_an_http_port_in_use_is_refused_in_one_line_before_the_control_socket_exists(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = loopd("serve", "--home", str(home), "--http", f"127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"loopd serve: --http 127.0.0.1:{port}: Address already in use\n"
    assert not (home / SOCKET_NAME).exists()
