"""What a running ``loopd serve`` imports: the cluster's code only with ``--cluster``, the
HTTP port's only with ``--http``.

A restart is downtime: the daemon listens again only once its imports are done, and
every forked worker inherits what the daemon imported. Read here from the daemon's own
``-X importtime`` lines (``PYTHONPROFILEIMPORTTIME``) over its whole life: start, a
create, requests, a schedule delivered to a hibernated session, status, stop. Structure
only: the times are figures of the timers benchmark (docs/benchmarks.md), never asserted.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Final

import pytest

from supervisor.client.direct import Client
from tests.harness.support import log_user_keys, poll_until, running_daemon, wait_state

pytestmark = pytest.mark.timeout(120)
_IMPORTED: Final = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)
CLUSTER_ONLY: Final = (
    "supervisor.daemon.cluster_node",
    "supervisor.node",
    "supervisor.gateway",
    "supervisor.cluster.etcd",
    "supervisor.cluster.lease",
    "supervisor.cluster.ownership",
    "supervisor.cluster.transport",
    "supervisor.moves.move",
)
HTTP_ONLY: Final = ("supervisor.http.routes", "supervisor.http.server")
CLIENT: Final = ("supervisor.client",)
"""A client of the daemon: the HTTP port is one, the daemon itself is not."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _under(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def _imported_while_serving(home: Path, *args: str) -> set[str]:
    with running_daemon(home, "--idle-stop", "0.3", *args,
                        env={"PYTHONPROFILEIMPORTTIME": "1"}) as daemon:  # fmt: skip
        with Client(str(home)) as client:
            client.call("create", session="s")
            client.send("s", "hello", key="k1")
            wait_state(home, "s", "IDLE")
            at = time.time() + 1.0  # due once it rests again
            iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
            client.schedule("s", iso, "later", key="r1")  # wakes it
        poll_until(lambda: "r1" in log_user_keys(home, "s"), timeout=60, what="the delivery")
        wait_state(home, "s", "IDLE")
        assert daemon.stop() == 0
        return set(_IMPORTED.findall(daemon.log_path.read_text(errors="replace")))


def test_serve_of_one_home_imports_neither_the_cluster_nor_the_http_port(tmp_path: Path) -> None:
    imported = _imported_while_serving(tmp_path / "home")
    assert "supervisor.daemon.loop" in imported  # the lines are the daemon's
    assert _under(imported, CLUSTER_ONLY) == []
    assert _under(imported, HTTP_ONLY + CLIENT) == []


def test_serve_with_an_http_port_imports_it_and_still_not_the_cluster(tmp_path: Path) -> None:
    imported = _imported_while_serving(tmp_path / "home", "--http", f"127.0.0.1:{_free_port()}")
    assert _under(imported, HTTP_ONLY) == list(HTTP_ONLY)  # seen when imported
    assert _under(imported, CLUSTER_ONLY) == []
