"""The spare worker (supervisor/templates/spare.py): forked before it is needed, holding
nothing of serve's, it becomes the next worker a start forks; real serve, real SIGKILLs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from supervisor.client import call, call_with_retry
from supervisor.templates.spare import GIVE_UP, SPARE_NAME
from tests.harness.support import REPO, Daemon, poll_until, running_daemon, status


def _spare(daemon: Daemon) -> psutil.Process:
    """The one spare, once it goes by its name."""
    poll_until(lambda: len(daemon.spares()) == 1, what="the spare worker")
    [spare] = daemon.spares()
    return spare


def _replaced(daemon: Daemon, old: int) -> Callable[[], bool]:
    return lambda: [p.pid for p in daemon.spares()] not in ([], [old])


def _gone(daemon: Daemon, old: int) -> Callable[[], bool]:
    return lambda: old not in [p.pid for p in daemon.spares()]


def _sockets_and_pipes(pid: int) -> set[str]:
    held = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith(("socket:", "pipe:")) and int(name) > 2:
            held.add(target)
    return held


def test_a_killed_worker_is_replaced_by_the_spare_which_is_replaced_in_turn(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        for n in range(3):
            spare = _spare(daemon)
            # Once its warm-up's own sockets are closed, it holds one socket (its order
            # socket), nothing of serve's: not the control socket, not a worker's channel.
            poll_until(lambda: len(_sockets_and_pipes(spare.pid)) == 1, what="one socket")  # noqa: B023
            os.kill(int(status(home, "s1")["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
            reply = call_with_retry(str(home), "send", session="s1", text=f"after kill {n}",
                                    key=f"k{n}", deadline=time.monotonic() + 60)  # fmt: skip
            assert isinstance(reply, dict)
            assert status(home, "s1")["pid"] == spare.pid  # the spare became the worker
            assert psutil.Process(spare.pid).name() == "loopd:s1"
            poll_until(_replaced(daemon, spare.pid), what="a new spare")
        spare = _spare(daemon)
    # serve's stop ends the spare too (the harness's stop reaps serve, then looks)
    assert not psutil.pid_exists(spare.pid) or psutil.Process(spare.pid).status() == "zombie"


_DIES_WARMING = """
import os
import supervisor.templates.spare as spare
spare._warm = lambda *_: os._exit(7)  # every spare dies before it is ready
"""


def test_spares_that_die_before_they_are_ready_are_given_up_and_workers_still_start(
    tmp_path: Path,
) -> None:
    # Patched into serve (and so into what it forks) at its interpreter's start.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_DIES_WARMING)
    home = tmp_path / "home"
    path = os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", str(REPO))])
    with running_daemon(home, env={"PYTHONPATH": path}) as daemon:
        said = f"{GIVE_UP} spare workers in a row died before they were ready"
        poll_until(lambda: said in daemon.log_path.read_text(errors="replace"),
                   what="serve to say it gave spares up")  # fmt: skip
        call(str(home), "create", session="s1")  # forked plainly
        assert status(home, "s1")["state"] == "RUNNING"
        assert daemon.spares() == []


def test_a_spare_ends_by_itself_when_serve_is_sigkilled(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        spare = _spare(daemon)
        daemon.proc.kill()
        daemon.proc.wait()
        poll_until(lambda: not spare.is_running() or spare.status() == "zombie",
                   timeout=10, what="the spare to end at its order socket's end")  # fmt: skip


def test_a_stopped_spare_ends_with_serve_and_a_worker_it_became_outlives_it(
    tmp_path: Path,
) -> None:
    """A SIGSTOPped spare never saw its socket's end when serve was SIGKILLed: it stayed
    for good. A worker it became must not die with serve (it finishes its batch)."""
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        first = _spare(daemon)
        poll_until(lambda: len(_sockets_and_pipes(first.pid)) == 1, what="the spare ready")
        os.kill(int(status(home, "s1")["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        call_with_retry(str(home), "send", session="s1", text="x", key="k1",
                        deadline=time.monotonic() + 60)  # fmt: skip
        assert status(home, "s1")["pid"] == first.pid  # the spare became s1's worker
        poll_until(_replaced(daemon, first.pid), what="a new spare")
        second = _spare(daemon)
        os.kill(second.pid, signal.SIGSTOP)
        daemon.proc.kill()
        daemon.proc.wait()
        poll_until(lambda: not second.is_running() or second.status() == "zombie",
                   timeout=10, what="the stopped spare to die with serve")  # fmt: skip
        assert first.is_running()  # the worker the first spare became lives on
        assert first.name() == "loopd:s1"


@pytest.mark.parametrize("method", ["exec", "template"])
def test_no_spare_is_kept_where_workers_are_not_forked_from_serve(
    tmp_path: Path, method: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--start-method", method) as daemon:
        call(str(home), "create", session="s1")
        assert daemon.spares() == []


def test_a_stopped_spare_is_not_handed_a_session_it_is_killed_and_replaced(
    tmp_path: Path,
) -> None:
    """A spare SIGSTOPped (a debugger, a freezer cgroup) once took the order and ran
    nothing: the session stayed STARTING until --start-timeout (60 s) killed it."""
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        spare = _spare(daemon)
        poll_until(lambda: len(_sockets_and_pipes(spare.pid)) == 1, what="the spare ready")
        os.kill(spare.pid, signal.SIGSTOP)
        os.kill(int(status(home, "s1")["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        started = time.monotonic()
        reply = call_with_retry(str(home), "send", session="s1", text="after the kill",
                                key="k1", deadline=time.monotonic() + 60)  # fmt: skip
        assert isinstance(reply, dict)
        assert time.monotonic() - started < 30  # not the start timeout's 60 s
        assert status(home, "s1")["pid"] != spare.pid  # forked plainly
        poll_until(lambda: not spare.is_running() or spare.status() == "zombie",
                   what="the stopped spare killed")  # fmt: skip
        poll_until(_replaced(daemon, spare.pid), what="a new spare")


def test_serve_never_answers_to_the_spares_name(tmp_path: Path) -> None:
    """serve's own thread once went by ``loopd-spare`` while it forked one: an operator's
    ``pkill -x loopd-spare`` could stop serve."""
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        comm = os.open(f"/proc/{daemon.proc.pid}/comm", os.O_RDONLY)
        seen: set[bytes] = set()
        try:
            for n in range(4):
                old = _spare(daemon).pid
                os.kill(int(status(home, "s1")["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
                deadline = time.monotonic() + 60
                while not _replaced(daemon, old)() and time.monotonic() < deadline:
                    for _ in range(300):  # serve's name, read as the next spare is forked
                        seen.add(os.pread(comm, 64, 0).strip())
                call_with_retry(str(home), "send", session="s1", text=f"n{n}", key=f"k{n}",
                                deadline=time.monotonic() + 60)  # fmt: skip
        finally:
            os.close(comm)
        assert SPARE_NAME.encode() not in seen, seen
