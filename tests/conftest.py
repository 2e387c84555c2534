"""Shared fixtures and helpers: a baseline, a home, a torn session, a no-orphans guard.

The run's end kills whatever the run left running, however it escaped the guard
(``tests.harness.leftover_reaper``, whose hooks are this conftest's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from chaos.oracle.oracle import file_digests
from tests.harness.etcd_server import EtcdServer
from tests.harness.leftover_reaper import pytest_configure, pytest_unconfigure
from tests.harness.postgres_server import PostgresServer
from worker import Baseline, Session
from worker.app import DefaultApp

__all__ = ["file_digests", "pytest_configure", "pytest_unconfigure"]

HUGE_LINE = b'{"type":' + json.dumps("x" * (2 << 20)).encode() + b"}\n"
"""A log line refused as an unknown record type whose name, quoted in the error, is 2 MiB."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: two test workers per core, at most four more than the cores.

    The suite waits more than it computes: real servers starting, real timeouts
    running out, workers killed and restarted. On 2 cores it kept 1.1 of them busy
    with 2 workers (521 s), 1.3 with 4 (333 s, docs/benchmarks.md "The suite").
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still chooses the count (xdist's own hook).
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0))
    return min(2 * cores, cores + 4)


@pytest.fixture(autouse=True)
def no_child_survives() -> Iterator[None]:
    """Fail a test that leaves a child process of the test runner alive."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    alive = []
    for p in left:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    for p in alive:
        p.kill()
    assert not alive, f"child processes left running: {[p.pid for p in alive]}"


@pytest.fixture
def baseline() -> Baseline:
    return Baseline(system="sys", memory="", tools=[{"name": "echo"}])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def torn_session(home: Path, session_id: str, tail: bytes = b'{"type":"User","ti') -> Path:
    """Create a session with the default app's baseline whose log ends in a torn line."""
    Session.create(home, session_id, DefaultApp().initial_baseline(session_id)).close()
    log = home / "sessions" / session_id / "0.jsonl"
    with log.open("ab") as f:
        f.write(tail)
    return log


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for one test module (tests.harness.postgres_server: skipped where
    Debian's package is not installed, a failure under CI)."""
    pg = PostgresServer()
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd member on loopback for one test, stopped and reaped at the end."""
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()
