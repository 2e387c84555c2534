"""Helpers for tests that run a real supervisor: start it, talk to it, stop it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psutil

from chaos.proc_states import all_stopped, thread_states
from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from supervisor.templates.spare import SPARE_NAMES

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_NAME = "loopd-template"
"""The process name of an App's template (supervisor/templates/template_main.py)."""
T = TypeVar("T")


def poll_until(
    check: Callable[[], T | None], *, timeout: float = 20.0, what: str = "condition"
) -> T:
    """Return check()'s first truthy value; fail after ``timeout`` seconds.

    Polls against a deadline (the interval only spaces the checks out).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def log_user_keys(home: Path, session: str) -> list[str | None]:
    """The key of every User record in the session's logs, oldest epoch first, from the files."""
    keys = []
    directory = home / "sessions" / session
    for log in sorted(directory.glob("*.jsonl"), key=lambda p: int(p.name.split(".")[0])):
        for line in log.read_bytes().splitlines():
            record = json.loads(line)
            if record["type"] == "User":
                keys.append(record["key"])
    return keys


def loopd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the operator CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def status(home: Path, session: str) -> dict[str, object]:
    rows = call(str(home), "status", session=session)
    assert isinstance(rows, list)
    row = rows[0]
    assert isinstance(row, dict)
    return row


def wait_state(home: Path, session: str, state: str, **more: object) -> dict[str, object]:
    def reached() -> dict[str, object] | None:
        row = status(home, session)
        if row["state"] == state and all(row.get(k) == v for k, v in more.items()):
            return row
        return None

    return poll_until(reached, what=f"{session} to be {state} {more}")


class Daemon:
    """A real ``loopd serve`` process for one test (``module`` is what ``python -m`` runs)."""

    def __init__(
        self,
        home: Path,
        *args: str,
        env: dict[str, str] | None = None,
        module: str = "supervisor",
    ) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        # The supervisor's log goes to a file, not a pipe nobody reads: its event lines
        # could otherwise fill the pipe and block it.
        self.log_path = home.parent / f"{home.name}.serve.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "serve", "--home", str(home), *args],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        poll_until(self._answers, what="the supervisor to listen")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            out = self.log_path.read_text(errors="replace")
            raise AssertionError(f"supervisor exited with {self.proc.returncode}: {out}")
        if not (self.home / SOCKET_NAME).exists():
            return False
        try:
            call(str(self.home), "ping", timeout=5)
        except ControlError:
            return False
        return True

    def workers(self) -> list[psutil.Process]:
        """Its workers (and what they forked), not its Apps' templates: only processes
        still there when looked at (a template's intermediate child lives a millisecond,
        and one gone between the listing and the look has no name to tell it by)."""
        return [p for p in self._descendants()
                if _name(p) not in (TEMPLATE_NAME, *SPARE_NAMES) and p.is_running()]  # fmt: skip

    def spares(self) -> list[psutil.Process]:
        """Its spare worker, forked before it is needed (supervisor/templates/spare.py)."""
        return [p for p in self._descendants() if _name(p) in SPARE_NAMES]

    def templates(self) -> list[psutil.Process]:
        """Its Apps' template processes (docs/templates.md)."""
        return [p for p in self._descendants() if _name(p) == TEMPLATE_NAME]

    def _descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self) -> int:
        """SIGTERM, a deadline, SIGKILL; reap; kill any worker or template still alive."""
        workers = self._descendants() if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        for proc in alive:
            proc.kill()
        return code


def _name(proc: psutil.Process) -> str | None:
    try:
        return str(proc.name())
    except psutil.NoSuchProcess:
        return None


@contextmanager
def running_daemon(
    home: Path, *args: str, env: dict[str, str] | None = None, module: str = "supervisor"
) -> Iterator[Daemon]:
    daemon = Daemon(home, *args, env=env, module=module)
    try:
        yield daemon
    finally:
        daemon.stop()


def stop(target: int | subprocess.Popen[Any]) -> int:
    """SIGSTOP a process and wait until every thread of it is stopped; its pid.

    A SIGSTOP is not in effect when ``kill`` returns: the kernel wakes one thread of the
    process to take it, and only once that thread has run are the others stopped. Until
    then the process goes on: a thread woken by a request can answer it (measured with a
    thread echoing on a socket: ``python -m scripts.chaos.sigstop_window``).
    """
    pid = target if isinstance(target, int) else target.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        poll_until(partial(all_stopped, pid), what=f"every thread of process {pid} to stop")
    except AssertionError:
        os.kill(pid, signal.SIGCONT)  # never left half stopped for the teardown
        raise
    return pid


@contextmanager
def stopped(*targets: int | subprocess.Popen[Any]) -> Iterator[None]:
    """``stop`` each process, run the block, and check, before the SIGCONT, that each
    still is stopped: a test of what a stopped process cannot do fails saying so if
    anything resumed one while the block ran."""
    pids: list[int] = []
    resumed: dict[int, list[str]] = {}
    try:
        for target in targets:
            pids.append(stop(target))
        yield
    finally:
        for pid in pids:
            if not all_stopped(pid):
                resumed[pid] = sorted(thread_states(pid).values())
            with suppress(ProcessLookupError):  # ended (and reaped) in the block
                os.kill(pid, signal.SIGCONT)
        if resumed:  # chained to whatever the block raised
            raise AssertionError(f"a stopped process was resumed while the test ran: {resumed}")


def kill_node(daemon: Daemon) -> None:
    """SIGKILL a node's serve and every worker of it at once, and reap them."""
    procs = [psutil.Process(daemon.proc.pid), *daemon.workers(), *daemon.templates()]
    for proc in procs:
        proc.kill()
    daemon.proc.wait(10)
    psutil.wait_procs(procs, timeout=10)


def serve_refused(
    home: Path, *args: str, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """``loopd serve`` that is expected to refuse at once (killed after ``timeout``)."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home), *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO,
    )  # fmt: skip


def one_line(text: str) -> str:
    """``text`` stripped, which must be one line and no traceback."""
    assert "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    return text.strip()


def ready_templates(daemon: Daemon, count: int = 1) -> list[int]:
    """The pids of the first ``count`` templates serve said ready (its log)."""

    def said() -> list[int] | None:
        text = daemon.log_path.read_text(errors="replace")
        pids = [int(p) for p in re.findall(r"template of App .*: ready \(pid (\d+),", text)]
        return pids if len(pids) >= count else None

    return poll_until(said, timeout=60, what=f"{count} template(s) to be ready")


def importers(counter: Path) -> set[int]:
    """The pids an App wrote to its import counter ``counter``, one a line."""
    return {int(line) for line in counter.read_text().split()} if counter.exists() else set()
