"""What an App's import may leave in its template (docs/templates.md, "What a template
refuses"): descriptors and processes are refused like threads, an import that exits is
said in one line, and a template that dies between forking a worker and answering fails
only that start (the worker it forked is waited for, never fought)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from supervisor.client import Client, call
from tests.harness.support import (
    Daemon,
    loopd,
    poll_until,
    running_daemon,
    status,
    stopped,
)

pytestmark = pytest.mark.timeout(180)

APP = "tests.apps.import_effect_apps:EffectApp"


def _said(daemon: Daemon, text: str) -> bool:
    return text in daemon.log_path.read_text(errors="replace")


def _answer(home: Path, session: str, count: int) -> None:
    with Client(str(home), timeout=60) as client:
        call(str(home), "create", session=session)
        for n in range(count):
            reply = client.send(session, f"hello {n}", key=f"k{n}")
            assert reply["text"] == f"echo: hello {n}"


def test_an_app_that_opens_its_log_file_at_import_gets_no_template_and_logs_each_request(
    tmp_path: Path,
) -> None:
    """Forked from a template, the worker's own descriptors would be put at the numbers of
    the App's log file: its lines went into the worker's channel or its session's log."""
    home, log = tmp_path / "home", tmp_path / "app.log"
    env = {"LOOPD_TEST_AT_IMPORT": f"log:{log}"}
    with running_daemon(home, "--app", APP, env=env) as daemon:
        poll_until(lambda: _said(daemon, "refused, its import left descriptor"),
                   timeout=60, what="the template to be refused")  # fmt: skip
        assert _said(daemon, f"({log})")
        _answer(home, "s1", 3)
        assert daemon.templates() == []
        lines = log.read_text().splitlines()
        assert [line.split(" ", 1)[1] for line in lines] == [f"request hello {n}" for n in range(3)]
    done = loopd("verify", "--home", str(home))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_process_the_import_started_refuses_the_template_and_is_not_left_running(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", APP, env={"LOOPD_TEST_AT_IMPORT": "child"}) as daemon:
        poll_until(lambda: _said(daemon, "refused, its import left process"),
                   timeout=60, what="the template to be refused")  # fmt: skip
        _answer(home, "s1", 1)
    poll_until(lambda: not _children_left(), timeout=20, what="the import's child to be gone")


def _children_left() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "import-effect-child" in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.parametrize(
    ("what", "said"),
    [
        ("sysexit", "the App failed to import (SystemExit: 4)"),
        (
            "exit",
            "ended while importing the App, before it said whether the App imported (exit code 3",
        ),
    ],
    ids=["sys.exit", "os._exit"],
)
def test_an_import_that_exits_is_said_in_one_line_and_its_workers_serve(
    tmp_path: Path, what: str, said: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", APP, env={"LOOPD_TEST_AT_IMPORT": what}) as daemon:
        poll_until(lambda: _said(daemon, said), timeout=60, what="the template's end said")
        _answer(home, "s1", 1)
        assert "Traceback" not in daemon.log_path.read_text(errors="replace")


def test_a_template_killed_before_it_answers_a_fork_fails_that_start_and_its_worker_is_waited_for(
    tmp_path: Path,
) -> None:
    """The template forks the worker, then dies before it says so (held 2 s after each
    fork, SIGKILLed meanwhile). The worker it forked lives on, adopted by serve, holding
    the session's lock (stopped here, as a busy machine may hold it): the next start waits
    for it, SIGKILLs it past the hang timeout, and runs; the session is never FATAL."""
    home = tmp_path / "home"
    env = {"LOOPD_TEST_AT_IMPORT": "slow-fork:2"}
    with running_daemon(home, "--app", APP, "--hang-timeout", "2", env=env) as daemon:
        poll_until(lambda: _said(daemon, "ready (pid"), timeout=60, what="the template")
        [template] = daemon.templates()
        call(str(home), "create", session="s1", timeout=60)  # its worker: forked plainly?
        first = int(str(status(home, "s1")["pid"]))
        os.kill(first, signal.SIGKILL)  # the restart is ordered from the template

        def orphan() -> int | None:
            for proc in daemon.workers():
                if proc.pid != first and proc.name() == "loopd:s1" and _holds_a_lock(proc.pid):
                    return proc.pid
            return None

        held = poll_until(orphan, timeout=30, what="the template's worker to hold the lock")
        with stopped(held):
            os.kill(template.pid, signal.SIGKILL)
            poll_until(lambda: status(home, "s1")["state"] == "BACKOFF"
                       and "an earlier worker of it" in str(status(home, "s1")["last_error"]),
                       timeout=30, what="the start to wait for the lock's holder")  # fmt: skip
        poll_until(lambda: status(home, "s1")["state"] == "RUNNING", timeout=60,
                   what="the session to run again")  # fmt: skip
        assert not psutil.pid_exists(held) or psutil.Process(held).status() == "zombie"
        with Client(str(home), timeout=60) as client:
            assert client.send("s1", "after", key="after")["text"] == "echo: after"


def _holds_a_lock(pid: int) -> bool:
    with open("/proc/locks", encoding="ascii") as locks:
        return any(line.split()[4] == str(pid) for line in locks if len(line.split()) > 4)
