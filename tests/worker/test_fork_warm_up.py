"""What serve does before its first fork (worker/warm_up.py), and the client's reply reader
kept between calls: both change no behaviour, which these tests pin down."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from supervisor.client.direct import _round_trip
from supervisor.sessions import spawn
from supervisor.sessions.spawn import StartMethod, prepare_forks
from worker import warm_up as warm_up_module
from worker.ipc.wire import FrameReader, encode
from worker.process import parse_args
from worker.store.disk import durable
from worker.store.disk.durable import Boundary
from worker.store.errors import SessionIOError
from worker.store.stats import STATS
from worker.warm_up import STALE_AFTER, remove_stale_scratch, scratch_home, warm_up


def _scratch_dirs(where: Path) -> set[str]:
    return {name for name in os.listdir(where) if name.startswith("loopd-warm-up-")}


def test_warm_up_serves_in_process_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm_up_module, "_MEMORY", str(tmp_path))
    seen: list[Boundary] = []

    def hook(boundary: Boundary) -> None:
        seen.append(boundary)

    previous = durable.set_hook(hook)
    try:
        warm_up(requests=4)
        assert durable.set_hook(None) is hook, "the rig's hook is put back"
    finally:
        durable.set_hook(previous)
    assert seen == [], "no boundary of the scratch session reaches a chaos hook"
    assert _scratch_dirs(tmp_path) == set(), "its directory is removed"
    assert STATS.requests == 0, "the counters it moved are reset"
    fds = set(os.listdir("/proc/self/fd"))
    warm_up(requests=2)
    assert set(os.listdir("/proc/self/fd")) == fds, "no descriptor is left open"


def test_a_warm_up_that_cannot_run_is_reported_and_serve_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail() -> None:
        raise SessionIOError("/nowhere/warm-up", 28, "write")

    monkeypatch.setattr(spawn, "warm_up", fail)
    why = prepare_forks(StartMethod.FORK)
    assert why is not None
    assert "warm-up was skipped" in why
    assert "/nowhere/warm-up" in why
    assert prepare_forks(StartMethod.EXEC) is None  # exec inherits nothing: no warm-up


def test_the_worker_parser_is_shared_but_each_parse_is_its_own() -> None:
    first = parse_args(["--home", "/a", "--session", "s1", "--channel-fd", "3", "--poison", "ab:2"])
    second = parse_args(["--home", "/b", "--session", "s2", "--channel-fd", "4"])
    assert (first.home, first.session, first.poison) == ("/a", "s1", ["ab:2"])
    assert (second.home, second.session, second.poison) == ("/b", "s2", [])
    with pytest.raises(SystemExit):
        parse_args(["--session", "s3", "--channel-fd", "5"])  # --home is required


def test_a_kept_reader_drops_what_came_after_a_reply_as_a_fresh_one_did() -> None:
    client, worker = socket.socketpair()
    reader = FrameReader()
    with client, worker:
        # A stray frame and half of another behind the first reply, in the same bytes.
        stray = encode({"id": 99, "ok": True, "result": "stray"})
        worker.sendall(encode({"id": 1, "ok": True, "result": "one"}) + stray + stray[:3])
        assert _round_trip(client, encode({"id": 1, "op": "status"}), reader)["result"] == "one"
        worker.recv(1 << 16)
        worker.sendall(encode({"id": 2, "ok": True, "result": "two"}))
        assert _round_trip(client, encode({"id": 2, "op": "status"}), reader)["id"] == 2
        worker.recv(1 << 16)
        # A bad frame: an error, and the next reply is read from a clean state.
        worker.sendall(b"\xc1" + encode({"id": 3, "ok": True, "result": "lost"}))
        with pytest.raises(Exception, match="undecodable"):
            _round_trip(client, encode({"id": 3, "op": "status"}), reader)
        worker.recv(1 << 16)
        worker.sendall(encode({"id": 4, "ok": True, "result": "four"}))
        assert _round_trip(client, encode({"id": 4, "op": "status"}), reader)["id"] == 4


def _dead_pid() -> int:
    """A pid no process has (a child forked and reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_scratch_left_by_a_gone_maker_is_removed_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serve SIGKILLed with its spare leaves the spare's scratch directory; the next
    serve's spares remove it, never one a live process or another user may be using."""
    monkeypatch.setattr(warm_up_module, "_MEMORY", str(tmp_path))
    dead, alive, old = _dead_pid(), os.getpid(), time.time() - 2 * STALE_AFTER
    cases = {
        f"loopd-warm-up-{dead}-abc123": True,  # its maker gone, old: removed
        f"loopd-warm-up-{alive}-abc123": False,  # its maker alive
        f"loopd-warm-up-{dead}-young1": False,  # made a moment ago (another pid namespace?)
        "loopd-warm-up-ab1c2d": False,  # no pid in its name: an older serve's
        f"other-{dead}-abc123": False,
    }
    for name in cases:
        (tmp_path / name / "sessions").mkdir(parents=True)
        if "young" not in name:
            os.utime(tmp_path / name, (old, old))
    assert remove_stale_scratch() == 1
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, gone in cases.items() if not gone)
    made = scratch_home()
    assert os.path.basename(made).startswith(f"loopd-warm-up-{os.getpid()}-")
