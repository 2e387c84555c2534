"""The HTTP port's connection bound against a real ``loopd serve --http``: hundreds of
connections at once (event streams a browser keeps open), within the open-file limit."""

from __future__ import annotations

import contextlib
import http.client
import resource
import socket
from pathlib import Path

import psutil
import pytest

from supervisor.http.limits import MAX_CONNECTIONS
from tests.harness.support import running_daemon


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.timeout(180)
def test_six_hundred_connections_at_once_are_served_and_the_file_limit_raised(
    tmp_path: Path,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard limit on open files is {hard}: serve could not raise it")
    port = _free_port()
    # serve starts with a service's usual soft limit and must raise it for its port.
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        daemon = running_daemon(tmp_path / "home", "--http", f"127.0.0.1:{port}")
        served = daemon.__enter__()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    held: list[http.client.HTTPConnection] = []
    try:
        limit = psutil.Process(served.proc.pid).rlimit(psutil.RLIMIT_NOFILE)
        assert limit[0] >= MAX_CONNECTIONS, limit
        # More than the 512 the port once allowed, each answered and kept alive (the
        # port keeps an idle one 5 s): all of them open at once.
        statuses = []
        for _ in range(600):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            conn.request("GET", "/v1/openapi.json")
            answer = conn.getresponse()
            answer.read()
            statuses.append(answer.status)
            held.append(conn)
        assert statuses == [200] * 600, sorted(set(statuses))
    finally:
        for conn in held:
            with contextlib.suppress(OSError):
                conn.close()
        daemon.__exit__(None, None, None)
