"""App templates (docs/templates.md): a child of serve per App imports it once and forks
its workers, which serve still reaps and watches with their real exit statuses."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from supervisor.client import Client, call
from supervisor.errors import ControlError
from tests.harness.support import (
    REPO,
    Daemon,
    importers,
    loopd,
    poll_until,
    ready_templates,
    running_daemon,
    status,
    wait_state,
)

pytestmark = pytest.mark.timeout(180)

TEMPLATE = ("--start-method", "template")  # the default App too (auto: not it)
HEAVY = "tests.apps.template_apps:HeavyApp"


def _create_and_answer(home: Path, *sessions: str) -> list[int]:
    """Create each session, send it a request; the pids of their workers."""
    pids = []
    with Client(str(home), timeout=60) as client:
        for session in sessions:
            call(str(home), "create", session=session)
            reply = client.send(session, f"hello {session}", key=f"k-{session}")
            assert reply["text"] == f"echo: hello {session}"
            pids.append(int(str(status(home, session)["pid"])))
    return pids


def test_workers_of_a_heavy_app_come_from_its_template_and_never_import_it(
    tmp_path: Path,
) -> None:
    home, counter = tmp_path / "home", tmp_path / "imports"
    env = {"LOOPD_TEST_IMPORTS": str(counter)}
    with running_daemon(home, *TEMPLATE, "--app", HEAVY, env=env) as daemon:
        [template] = ready_templates(daemon)
        workers = _create_and_answer(home, "s1", "s2", "s3")
        assert template in importers(counter)
        assert not set(workers) & importers(counter), "a worker imported its App itself"
        for pid in workers:  # reparented to serve, which reaps it
            assert psutil.Process(pid).ppid() == daemon.proc.pid
        assert [p.pid for p in daemon.templates()] == [template]


def test_by_default_the_app_and_each_named_app_get_a_template_whose_workers_serve_reaps(
    tmp_path: Path,
) -> None:
    """No ``--start-method``: ``auto``. Serve's ``--app`` and a named App with its own
    environment (another App identity) each get a template, a child of serve; their
    workers come from them (neither imports its App) and are serve's children."""
    home, serves, named = tmp_path / "home", tmp_path / "imports", tmp_path / "named-imports"
    home.mkdir()
    (home / "loopd.toml").write_text(
        f'[apps.heavy]\napp = "{HEAVY}"\nenv = {{ LOOPD_TEST_IMPORTS = "{named}" }}\n'
    )
    with running_daemon(home, "--app", HEAVY, env={"LOOPD_TEST_IMPORTS": str(serves)}) as daemon:
        templates = set(ready_templates(daemon, 2))
        assert {p.pid for p in daemon.templates()} == templates
        for pid in templates:
            assert psutil.Process(pid).ppid() == daemon.proc.pid
        assert len(templates & importers(serves)) == len(templates & importers(named)) == 1
        [plain] = _create_and_answer(home, "s1")
        created = loopd("create", "--home", str(home), "s2", "--app", "heavy")
        assert created.returncode == 0, created.stderr
        with Client(str(home), timeout=60) as client:
            assert client.send("s2", "hi", key="k-s2")["heavy"]
        workers = {plain, int(str(status(home, "s2")["pid"]))}
        assert not workers & (importers(serves) | importers(named)), "a worker imported"
        for pid in workers:
            assert psutil.Process(pid).ppid() == daemon.proc.pid
        psutil.Process(plain).kill()  # reaped by serve with its real status, restarted
        row = wait_state(home, "s1", "RUNNING", restarts=1)
        assert row["last_error"] == "worker killed by SIGKILL", row
        assert int(str(row["pid"])) not in importers(serves)


def test_by_default_the_default_app_gets_no_template_its_workers_fork_from_serve(
    tmp_path: Path,
) -> None:
    """No ``--start-method`` and no ``--app``: loopd's default App, which serve imported
    and warmed itself, is forked from serve as with ``fork``: no template, no round trip."""
    home = tmp_path / "home"
    with running_daemon(home) as daemon:  # templates start before serve listens
        [worker] = _create_and_answer(home, "s1")
        poll_until(lambda: len(daemon.spares()) == 1, what="the spare worker")  # named
        children = psutil.Process(daemon.proc.pid).children(recursive=True)
        spare = {p.pid for p in daemon.spares()}
        assert [p.pid for p in children if p.pid not in spare] == [worker]
        assert psutil.Process(worker).ppid() == daemon.proc.pid
        assert "template of App" not in daemon.log_path.read_text(errors="replace")


def test_workers_forked_from_serve_import_the_app_each(tmp_path: Path) -> None:
    """The control of the test above: its assertion fails without templates."""
    home, counter = tmp_path / "home", tmp_path / "imports"
    env = {"LOOPD_TEST_IMPORTS": str(counter)}
    with running_daemon(home, "--app", HEAVY, "--start-method", "fork", env=env) as daemon:
        workers = _create_and_answer(home, "s1", "s2")
        assert set(workers) <= importers(counter)
        assert daemon.templates() == []


def test_a_killed_template_is_replaced_at_the_next_start_and_its_workers_run_on(
    tmp_path: Path,
) -> None:
    home, counter = tmp_path / "home", tmp_path / "imports"
    env = {"LOOPD_TEST_IMPORTS": str(counter)}
    daemon = Daemon(home, *TEMPLATE, "--app", HEAVY, env=env)
    try:
        [first] = ready_templates(daemon)
        [s1] = _create_and_answer(home, "s1")
        psutil.Process(first).kill()
        poll_until(lambda: first not in [p.pid for p in daemon.templates()],
                   what="the killed template to be reaped")  # fmt: skip
        assert not psutil.pid_exists(first) or psutil.Process(first).status() != "zombie"
        _create_and_answer(home, "s2")  # forked from serve while the new one imports
        second = ready_templates(daemon, 2)[1]
        assert second != first
        [s3] = _create_and_answer(home, "s3")
        assert s3 not in importers(counter)
        with Client(str(home), timeout=60) as client:  # the first template's worker lives on
            assert client.send("s1", "still", key="k-still")["text"] == "echo: still"
        assert int(str(status(home, "s1")["pid"])) == s1
        everything = [psutil.Process(daemon.proc.pid), *daemon.workers(), *daemon.templates()]
    finally:
        assert daemon.stop() == 0
    _gone, alive = psutil.wait_procs(everything, timeout=20)
    assert alive == []


def test_a_stopped_template_is_not_asked_it_is_killed_and_its_start_forks_plainly(
    tmp_path: Path,
) -> None:
    """A SIGSTOPped template (a debugger, a freezer cgroup) held serve's loop for its
    reply timeout (5 s) at each start, and the start failed (BACKOFF, a restart charged)."""
    home = tmp_path / "home"
    with running_daemon(home, *TEMPLATE, "--app", HEAVY) as daemon:
        [first] = ready_templates(daemon)
        os.kill(first, signal.SIGSTOP)
        started = time.monotonic()
        [s1] = _create_and_answer(home, "s1")
        assert time.monotonic() - started < 4.0  # never the template's 5 s reply timeout
        row = status(home, "s1")
        assert (row["state"], row["restarts"]) == ("RUNNING", 0), row
        gone = lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"  # noqa: E731
        poll_until(gone, what="the stopped template killed")
        assert "stopped (SIGSTOP?); killed" in daemon.log_path.read_text(errors="replace")
        assert ready_templates(daemon, 2)[1] != first  # a new one imported the App
        assert s1 != first


def test_an_app_that_no_longer_imports_is_fatal_after_its_retries_and_serve_lives(
    tmp_path: Path,
) -> None:
    home, marker = tmp_path / "home", tmp_path / "broken"
    env = {"LOOPD_TEST_BROKEN": str(marker)}
    with running_daemon(home, *TEMPLATE, "--app", HEAVY, "--start-retries", "2", env=env) as daemon:
        [template] = ready_templates(daemon)
        marker.touch()  # the App's code broke on disk after serve checked it
        psutil.Process(template).kill()  # the next template imports it again, and fails
        poll_until(lambda: daemon.templates() == [], what="the template to be reaped")
        with pytest.raises(ControlError, match=r"FATAL.*this App no longer imports"):
            call(str(home), "create", session="s1")
        row = wait_state(home, "s1", "FATAL")
        assert "this App no longer imports" in str(row["last_error"]), row
        log = daemon.log_path.read_text(errors="replace")
        assert "the App failed to import (RuntimeError: this App no longer imports" in log
        assert call(str(home), "ping") is not None  # serve lives
        poll_until(lambda: daemon.templates() == [], what="the failed templates to end")


def test_exit_statuses_of_template_forked_workers_reach_serve_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *TEMPLATE, "--app", "tests.apps.exit_code_apps:ExitingApp") as daemon:
        ready_templates(daemon)
        [pid] = _create_and_answer(home, "s1")
        psutil.Process(pid).kill()
        row = wait_state(home, "s1", "RUNNING", restarts=1)
        assert row["last_error"] == "worker killed by SIGKILL", row
        with Client(str(home), timeout=60) as client, pytest.raises(ControlError):
            client.send("s1", "exit 42", key="k-exit")
        row = poll_until(lambda: _restarted_after(home, "s1", 2), what="the exit 42 seen")
        assert "exit code 42" in str(row["last_error"]), row
        call(str(home), "stop", session="s1")
        wait_state(home, "s1", "STOPPED")
        log = daemon.log_path.read_text(errors="replace")
        killed = r"s1 RUNNING -> BACKOFF \(worker killed by SIGKILL\) pid=\d+ signal=9"
        assert re.search(killed, log), log
        assert re.search(r"s1 STOPPING -> STOPPED .* exit=0", log), log


def _restarted_after(home: Path, session: str, restarts: int) -> dict[str, object] | None:
    row = status(home, session)
    return row if int(str(row["restarts"])) >= restarts and row["state"] == "RUNNING" else None


def test_an_app_that_starts_a_thread_at_import_gets_no_template_and_still_answers(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    trap = "tests.apps.import_trap_apps:ThreadAtImportApp"
    with running_daemon(home, *TEMPLATE, "--app", trap) as daemon:
        poll_until(lambda: "import started threads (import-time client)"
                   in daemon.log_path.read_text(errors="replace"),
                   timeout=60, what="the template to be refused")  # fmt: skip
        _create_and_answer(home, "s1")
        assert daemon.templates() == []


_VERSIONED = """
from worker.app import DefaultApp


class VersionedApp(DefaultApp):
    def handle(self, session, request):
        return {**super().handle(session, request), "version": VERSION}


VERSION = "{version}"
"""


def _write_app(path: Path, version: str, mtime: int) -> None:
    path.write_text(_VERSIONED.replace("{version}", version))
    os.utime(path, ns=(mtime, mtime))  # a distinct mtime, however coarse the clock


def test_a_worker_started_after_its_app_changed_on_disk_runs_the_new_version(
    tmp_path: Path,
) -> None:
    home, source = tmp_path / "home", tmp_path / "versioned_app.py"
    _write_app(source, "v1", 1_000_000_000_000_000_000)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    with running_daemon(home, *TEMPLATE, "--app", "versioned_app:VersionedApp", env=env) as daemon:
        ready_templates(daemon)
        with Client(str(home), timeout=60) as client:
            call(str(home), "create", session="s1")
            assert client.send("s1", "a", key="k1")["version"] == "v1"
            _write_app(source, "v2", 2_000_000_000_000_000_000)
            call(str(home), "restart", session="s1")
            wait_state(home, "s1", "RUNNING")
            assert client.send("s1", "b", key="k2")["version"] == "v2"
            log = daemon.log_path.read_text(errors="replace")
            assert "versioned_app.py changed since its import" in log
            ready_templates(daemon, 2)  # the new template imported v2
            call(str(home), "create", session="s2")
            assert client.send("s2", "c", key="k3")["version"] == "v2"


def test_what_an_app_left_behind_is_reaped_by_serve_not_left_a_zombie(tmp_path: Path) -> None:
    """serve is the subreaper of its workers: an App's orphan comes to it, and is reaped."""
    home = tmp_path / "home"
    with running_daemon(home, *TEMPLATE, "--app", "tests.apps.forking_apps:ForkingApp") as daemon:
        ready_templates(daemon)
        call(str(home), "create", session="s")
        with Client(str(home), timeout=60, retry_for=30) as client:
            client.send("s", "os.fork then crash", key="k")
        [helper] = [int(p) for p in (home / "helper-pids").read_text().split()]
        wait_state(home, "s", "RUNNING", restarts=1)
        # Killed with its worker's process group; then serve's child (its subreaper),
        # which must wait for it: a zombie would stay until serve exits.
        poll_until(lambda: not psutil.pid_exists(helper), what=f"the helper {helper} reaped")


_GATED = """
import os
import time
from pathlib import Path

from worker.app import DefaultApp

VERSION = "{version}"
_GATE = Path(os.environ["LOOPD_TEST_GATE"])
with open("/proc/self/comm", encoding="utf-8") as _comm:
    if _comm.read().strip() == "loopd-template":  # a slow import, held open by the test
        (_GATE.parent / "reading").touch()
        _until = time.monotonic() + 60
        while not _GATE.exists() and time.monotonic() < _until:
            time.sleep(0.01)


class VersionedApp(DefaultApp):
    def handle(self, session, request):
        return {**super().handle(session, request), "version": VERSION}
"""


def test_an_app_changed_while_its_template_imported_it_is_imported_again_before_any_fork(
    tmp_path: Path,
) -> None:
    """A deploy that lands during a slow import: the template read v1, the file says v2.
    Its mtime falls inside the import, so the template forks nothing from v1."""
    home, source, gate = tmp_path / "home", tmp_path / "gated_app.py", tmp_path / "gate"
    source.write_text(_GATED.replace("{version}", "v1"))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "LOOPD_TEST_GATE": str(gate)}
    with running_daemon(home, "--app", "gated_app:VersionedApp", env=env) as daemon:
        poll_until((tmp_path / "reading").exists, timeout=60, what="the template's import")
        source.write_text(_GATED.replace("{version}", "v2"))
        gate.touch()
        ready_templates(daemon)
        with Client(str(home), timeout=60) as client:
            call(str(home), "create", session="s1")
            assert client.send("s1", "a", key="k1")["version"] == "v2"
        assert "gated_app.py changed since its import" in daemon.log_path.read_text()
