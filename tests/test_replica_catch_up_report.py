"""A new copy of an idle session, caught up between batches, on real daemons.

A grow waits for as long as the copy grows, and it reads that growth in the owner's
status (``copy_at`` in the lag rows, ``replica_grow.copy_at``): an idle session's worker
reports its state whenever a step of the catch-up was acknowledged. A worker catching a
copy up is busy: a daemon with ``--idle-stop`` does not hibernate it meanwhile (before,
the worker woken for the grow rested again before a byte was shipped, and the grow
failed).

The tests run with ``-m cluster_sweep`` (half a minute each).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.replica_nodes import NAMES, Nodes, running_nodes
from tests.support import loopd, poll_until, status

pytestmark = [pytest.mark.timeout(100), pytest.mark.cluster_sweep]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    with running_nodes(tmp_path / "rc") as cluster:
        yield cluster


def _size(session_dir: Path) -> int:
    """The bytes of every epoch's log in a session directory (or a copy of one): a big
    write ends an epoch of the default App, so the log is many epochs' files."""
    total = 0
    for log in session_dir.glob("*.jsonl"):
        with contextlib.suppress(FileNotFoundError):  # a copy's epoch set aside meanwhile
            total += log.stat().st_size
    return total


def _copy_at(home: Path, node: str) -> object:
    rows = status(home, "r").get("lag")
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("node") == node:
            return row.get("copy_at")
    return None


def test_an_idle_session_reports_where_its_new_copy_ends_while_it_grows(nodes: Nodes) -> None:
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        owner = nodes.owner()[0]
        source = nodes.replica_set().followers[0]
        (spare,) = (n for n in NAMES if n != owner and n not in nodes.replica_set().followers)
        big = "x" * 200_000
        for n in range(20):  # about 12 MB of log in 21 epochs; then no write meanwhile
            assert client.send("r", big, key=f"big{n}")["duplicate"] is False
    full = _size(nodes.root / owner / "sessions" / "r")
    copy = nodes.root / spare / "replicas" / "sessions" / "r"
    mover = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "move", "--cluster", nodes.etcd.url, "r",
         "--follower", source, "--to", spare],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    growing: list[tuple[int, object]] = []  # (the copy's size on disk, copy_at reported)
    try:
        deadline = time.monotonic() + 60
        while mover.poll() is None and time.monotonic() < deadline:
            size = _size(copy)
            if 0 < size < full:
                growing.append((size, _copy_at(nodes.root / owner, spare)))
        _out, err = mover.communicate(timeout=60)
    finally:
        if mover.poll() is None:
            mover.kill()
            mover.wait()
    assert mover.returncode == 0, err
    assert len({size for size, _at in growing}) >= 2  # seen growing on disk, in pieces
    reported = [at for _size_, at in growing if at is not None]
    assert reported, f"the copy grew through {len(growing)} polls, its owner reported nothing"


@pytest.fixture
def hibernating(tmp_path: Path) -> Iterator[Nodes]:
    """The four nodes with ``--idle-stop 3``: an idle worker rests after 3 s."""
    with running_nodes(tmp_path / "rh", serve_args=("--idle-stop", "3")) as cluster:
        yield cluster


def test_a_follower_move_of_a_hibernated_session_catches_the_new_copy_up(
    hibernating: Nodes,
) -> None:
    nodes = hibernating
    with nodes.client() as client:
        client.create("r")
        owner = nodes.owner()[0]
        source = nodes.replica_set().followers[0]
        (spare,) = (n for n in NAMES if n != owner and n not in nodes.replica_set().followers)
        for n in range(3):
            assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is False

    poll_until(lambda: status(nodes.root / owner, "r")["state"] == "IDLE", what="r hibernated")
    moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--follower", source, "--to",
                  spare, env=nodes.operator_env())  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert spare in nodes.replica_set().in_sync
    assert nodes.copy_keys(spare) == ["k0", "k1", "k2"]
