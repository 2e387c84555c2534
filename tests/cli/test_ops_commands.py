"""The operator's conveniences through the CLI on a real home: restart --all [--rolling N],
top (driven through tmux, as a person at a terminal would), systemd-unit."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.hosting.systemd_unit import render_unit
from tests.harness.support import REPO, loopd, poll_until, running_daemon, status, wait_state

EVENT = re.compile(r"event: \S+ (\S+) (\w+) -> (\w+)")


def _pids(home: Path, sessions: list[str]) -> dict[str, object]:
    return {s: status(home, s)["pid"] for s in sessions}


def _most_restarting_at_once(text: str) -> tuple[int, list[str]]:
    """From the daemon's event lines: the most sessions between STOPPING and RUNNING at
    any moment, and the order in which they were serving again."""
    restarting: set[str] = set()
    most, served = 0, []
    for line in text.splitlines():
        found = EVENT.search(line)
        if found is None:
            continue
        session, _old, new = found.groups()
        if new == "STOPPING":
            restarting.add(session)
        elif new == "RUNNING" and session in restarting:
            restarting.discard(session)
            served.append(session)
        most = max(most, len(restarting))
    return most, served


@pytest.mark.parametrize(("rolling", "expected"), [("1", 1), ("2", 2), (None, 5)])
def test_restart_all_restarts_every_running_session_at_most_n_at_a_time(
    tmp_path: Path, rolling: str | None, expected: int
) -> None:
    home = tmp_path / "home"
    sessions = ["s1", "s2", "s3", "s4", "s5"]
    with running_daemon(home, "--app", "tests.apps.ops_apps:SlowStartApp") as daemon:
        for session in [*sessions, "parked"]:
            call(str(home), "create", session=session)
        call(str(home), "stop", session="parked")
        before = _pids(home, sessions)
        mark = daemon.log_path.stat().st_size
        args = ["--rolling", rolling] if rolling else []
        done = loopd("restart", "--home", str(home), "--all", *args)
        assert done.returncode == 0, done.stderr
        after = _pids(home, sessions)
        for session in sessions:
            assert after[session] not in (None, before[session]), (session, done.stdout)
            assert f"restarted  {session} (pid {after[session]})" in done.stdout
        assert "skipped    parked: STOPPED, not running" in done.stdout
        assert done.stdout.splitlines()[-1] == "restarted 5 session(s); skipped 1"
        assert status(home, "parked")["state"] == "STOPPED"

        def roll_logged() -> tuple[int, list[str]] | None:
            with open(daemon.log_path, "rb") as log:
                log.seek(mark)
                seen = _most_restarting_at_once(log.read().decode(errors="replace"))
            return seen if sorted(seen[1]) == sessions else None

        most, served = poll_until(roll_logged, what="the roll's events in the daemon's log")
        if rolling is None:  # one session, as before --all existed
            single = loopd("restart", "--home", str(home), "s1")
            assert single.returncode == 0, single.stderr
            assert status(home, "s1")["pid"] not in (None, after["s1"])
            assert re.search(r"^s1 +RUNNING +\d+", single.stdout, re.M), single.stdout
    assert most == expected, served
    if rolling == "1":
        assert served == sessions  # one after the other, in id order


def test_a_session_that_does_not_come_back_stops_the_roll_and_is_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "broken"
    (home / "loopd.toml").write_text(
        '[apps.fragile]\napp = "tests.apps.ops_apps:FragileApp"\n'
        f'env = {{ LOOPD_TEST_BROKEN = "{marker}" }}\n'
    )
    sessions = ["a", "b", "c", "d"]
    with running_daemon(home, "--max-restarts", "0"):
        for session in sessions:
            call(str(home), "create", session=session, app="fragile" if session == "b" else None)
        before = _pids(home, sessions)
        marker.touch()  # the deploy broke b's App
        done = loopd("restart", "--home", str(home), "--all", "--rolling", "1")
        assert done.returncode == 1, done.stdout
        after = _pids(home, sessions)
        assert after["a"] not in (None, before["a"])
        assert (after["c"], after["d"]) == (before["c"], before["d"])  # never reached
        assert wait_state(home, "b", "FATAL")["last_error"]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("loopd restart: the roll stopped: b did not come back")
    assert "(1 restarted; not restarted: c, d)" in lines[0]
    assert f"restarted  a (pid {after['a']})" in done.stdout
    assert re.search(r"^FAILED     b after [\d.]+ s: .*broken by the deploy", done.stdout, re.M)


def test_a_session_not_serving_again_within_the_timeout_stops_the_roll(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "stall"
    (home / "loopd.toml").write_text(
        '[apps.stalling]\napp = "tests.apps.ops_apps:StallingApp"\n'
        f'env = {{ LOOPD_TEST_STALL = "{marker}" }}\n'
    )
    with running_daemon(home):
        call(str(home), "create", session="a", app="stalling")
        call(str(home), "create", session="b")
        before = _pids(home, ["a", "b"])
        marker.touch()
        done = loopd("restart", "--home", str(home), "--all", "--rolling", "1", "--timeout", "1")
        assert done.returncode == 1, done.stdout
        assert status(home, "b")["pid"] == before["b"]
    assert re.search(
        r"^FAILED     a after [\d.]+ s: did not serve again within 1 s$", done.stdout, re.M
    )
    assert "the roll stopped: a did not come back (0 restarted; not restarted: b)" in done.stderr


def test_restart_usage_errors_are_one_line(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    for args, why in [
        ([], "give a session ID, or --all"),
        (["x", "--all"], "give a session ID or --all, not both"),
        (["x", "--rolling", "2"], "--rolling N is for --all"),
        (["--all", "--rolling", "0"], "0 is not in the range"),
    ]:
        done = loopd("restart", "--home", home, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1, (args, done.stderr)
        assert why in done.stderr, (args, done.stderr)


def _tmux() -> str:
    found = shutil.which("tmux")
    if found is None:
        why = "no tmux: `apt-get install -y tmux` (.ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[str]]:
    """A tmux server of this test's own (its socket under tmp_path), killed at the end."""
    command = [_tmux(), "-S", str(tmp_path / "tmux.sock"), "-f", os.devnull]
    try:
        yield command
    finally:
        subprocess.run([*command, "kill-server"], capture_output=True, check=False, timeout=10)


def test_top_shows_every_session_live_and_quits_on_q(tmp_path: Path, tmux: list[str]) -> None:
    home = tmp_path / "home"
    exit_file = tmp_path / "top.exit"
    with running_daemon(home):
        for session in ("alpha", "beta"):
            call(str(home), "create", session=session)
        # COLUMNS=80 as a stale shell may export it: top follows the terminal's own size.
        top = f"COLUMNS=80 LINES=24 {sys.executable} -m supervisor top --home {home} --interval 0.2"
        subprocess.run(
            [*tmux, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40", "-c", str(REPO),
             f"{top}; echo $? > {exit_file}"],
            check=True, timeout=10,
        )  # fmt: skip

        def showing(*wanted: str) -> str | None:
            text = _screen(tmux)
            return text if all(re.search(w, text, re.M) for w in wanted) else None

        first = poll_until(
            lambda: showing(r"^2 sessions: 2 RUNNING$", r"^alpha +RUNNING +\d+", r"^beta +RUNNING"),
            what="top to show both sessions",
        )
        assert f"loopd top  {home}" in first
        header = r"^session +state +pid +epoch +records .* rss_mib +cpu% +tok/min +last_error$"
        assert re.search(header, first, re.M), first

        def spending() -> str | None:  # requests keep alpha's worker writing Usage records
            call(str(home), "send", session="alpha", text="more words to count")
            return showing(r"^alpha +RUNNING +\d+ +(\S+ +){6}[1-9]\d*\b")

        poll_until(spending, what="top to show alpha's tokens per minute")
        call(str(home), "create", session="gamma")
        call(str(home), "stop", session="beta")
        poll_until(
            lambda: showing(r"^3 sessions: 2 RUNNING, 1 STOPPED$", r"^beta +STOPPED +-",
                            r"^gamma +RUNNING +\d+"),
            what="top to show the new session and the stopped one",
        )  # fmt: skip
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=10)
        poll_until(lambda: exit_file.exists() and exit_file.read_text().strip(), what="top to quit")
    assert exit_file.read_text().strip() == "0"


def _screen(tmux: list[str]) -> str:
    shown = subprocess.run(
        [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=10,
        check=False,
    )  # fmt: skip
    return shown.stdout


def test_top_retries_a_supervisor_that_is_not_there_yet_and_scrolls(
    tmp_path: Path, tmux: list[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    exit_file = tmp_path / "top.exit"
    top = f"{sys.executable} -m supervisor top --home {home} --interval 0.2"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "top", "-x", "120", "-y", "6", "-c", str(REPO),
         f"{top}; echo $? > {exit_file}"],
        check=True, timeout=10,
    )  # fmt: skip
    poll_until(
        lambda: re.search(r"^no answer: cannot reach the supervisor.*", _screen(tmux), re.M),
        what="top to say that nothing answers",
    )
    with running_daemon(home):
        for session in ("s1", "s2", "s3", "s4", "s5"):
            call(str(home), "create", session=session)
        # 6 lines: the title, the summary, the header, then 3 of the 5 rows.
        top_rows = poll_until(
            lambda: re.search(r"^5 sessions: 5 RUNNING\nsession .*\ns1 .*\ns2 .*\ns3 .*$",
                              _screen(tmux), re.M),
            what="top to show the first rows",
        )  # fmt: skip
        assert top_rows
        subprocess.run([*tmux, "send-keys", "-t", "top", "End"], check=True, timeout=10)
        poll_until(
            lambda: re.search(r"^session .*\ns3 .*\ns4 .*\ns5 .*$", _screen(tmux), re.M),
            what="top to scroll to the last rows",
        )
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=10)
        poll_until(lambda: exit_file.exists() and exit_file.read_text().strip(), what="top to quit")
    assert exit_file.read_text().strip() == "0"


def test_top_without_a_terminal_says_so_in_one_line(tmp_path: Path) -> None:
    done = loopd("top", "--home", str(tmp_path))
    assert (done.returncode, done.stderr) == (
        1, "loopd top: needs a terminal (for a listing: loopd status)\n",
    )  # fmt: skip


def _documented_unit() -> str:
    text = (REPO / "docs" / "operations.md").read_text()
    found = re.search(r"```ini\n(# /etc/systemd/system/loopd\.service\n.*?)```", text, re.S)
    assert found is not None, "docs/operations.md lost its unit"
    return found.group(1)


def test_the_documented_unit_is_the_one_the_command_prints() -> None:
    rendered = render_unit(
        home="/var/lib/loopd", command=["/opt/loopd/venv/bin/loopd"], user="loopd"
    )
    assert rendered == _documented_unit()


def test_systemd_unit_prints_the_documented_unit_for_a_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    script = Path(os.path.abspath(sys.executable)).parent / "loopd"
    assert script.is_file()  # the test extra installs the console script beside python
    user = pwd.getpwuid(os.getuid()).pw_name  # the owner of the home
    done = loopd("systemd-unit", "--home", str(home))
    assert done.returncode == 0, done.stderr
    expected = (
        _documented_unit()
        .replace("User=loopd", f"User={user}")
        .replace("LOOPD_HOME=/var/lib/loopd", f"LOOPD_HOME={home}")
        .replace("/opt/loopd/venv/bin/loopd serve", f"{script} serve")
    )
    assert done.stdout == expected
    assert "Type=notify" in done.stdout
    relative = subprocess.run(
        [sys.executable, "-m", "supervisor", "systemd-unit", "--home", "home", "--user", "svc"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert f"Environment=LOOPD_HOME={home}\n" in relative.stdout
    assert "User=svc\n" in relative.stdout


def test_systemd_unit_quotes_what_systemd_would_split_and_refuses_what_it_cannot_hold(
    tmp_path: Path,
) -> None:
    spaced = tmp_path / "my home %h"
    done = loopd("systemd-unit", "--home", str(spaced), "--user", "svc")
    assert done.returncode == 0, done.stderr
    assert f'Environment="LOOPD_HOME={tmp_path}/my home %%h"\n' in done.stdout
    for args, why in [
        (["--home", f"{tmp_path}/a\nb"], "holds the control character '\\n'"),
        (["--home", str(tmp_path), "--user", "two words"], "not a user name systemd takes"),
        (["--home", os.fsdecode(os.fsencode(tmp_path) + b"/rv\xff")], "is not UTF-8 text"),
    ]:
        done = loopd("systemd-unit", *args)
        assert done.returncode == 1, done.stdout
        assert done.stderr.startswith("loopd systemd-unit: ")
        assert done.stderr.count("\n") == 1
        assert why in done.stderr, done.stderr


def test_a_request_sent_while_a_restart_stops_the_worker_waits_for_the_new_one(
    tmp_path: Path,
) -> None:
    """The docs' promise for a restart: a request arriving while the old worker stops
    is queued and answered by the new one, not refused ``unavailable``."""
    import threading

    home, marker = tmp_path / "home", tmp_path / "turn-started"
    env = {**os.environ, "LOOPD_TEST_TURN": str(marker)}
    with running_daemon(home, "--app", "tests.apps.ops_apps:SlowTurnApp", env=env):
        assert loopd("create", "--home", str(home), "s").returncode == 0
        wait_state(home, "s", "RUNNING")
        done: dict[str, subprocess.CompletedProcess[str]] = {}

        def run(name: str, *args: str) -> None:
            done[name] = loopd(*args, "--home", str(home))

        slow = threading.Thread(target=run, args=("slow", "send", "s", "slow", "--key", "k1"))
        slow.start()
        poll_until(marker.exists, what="the slow turn under way")
        restart = threading.Thread(target=run, args=("restart", "restart", "s"))
        restart.start()
        wait_state(home, "s", "STOPPING")  # the old worker finishes its 3 s turn
        during = loopd("send", "s", "during", "--key", "k2", "--home", str(home))
        slow.join(timeout=60)
        restart.join(timeout=60)
        assert during.returncode == 0, during.stdout + during.stderr
        assert "echo: during" in during.stdout
        assert done["restart"].returncode == 0, done["restart"].stderr
        assert status(home, "s")["state"] == "RUNNING"
