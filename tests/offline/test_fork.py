"""``loopd fork ID NEW --epoch E``: NEW shares ID's sealed epochs 0..E (hard links) and
starts epoch E+1 from E's recorded summary, offline and with ID live; a SIGKILL at any
durable step of the fork leaves no NEW or a whole one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from chaos.faults.hook import ChaosHook, EventPipe, FaultKind
from supervisor.client import Client, call
from tests.harness.forge import reseal_log
from tests.harness.support import loopd, running_daemon, wait_state
from worker import Assistant, Session, User
from worker.app import DefaultApp
from worker.offline.fork import ForkError, fork_session
from worker.store.disk import durable
from worker.store.errors import InvalidLog
from worker.store.format.records import Schedule, SessionStart
from worker.store.loader import load_session
from worker.store.schedules import pending_schedules

APP = DefaultApp()


def _home_of_three_sealed_epochs(home: Path, session: str = "a") -> None:
    """Epochs 0..2 sealed with keys k<epoch>-<n>, epoch 3 open with key open-0."""
    with Session.create(home, session, APP.initial_baseline(session)) as s:
        for epoch in range(3):
            for n in range(2):
                s.append_many([User(text=f"t{epoch}{n}", key=f"k{epoch}-{n}"), Assistant(text="a")])
            s.commit_epoch(APP.summarize(s), APP.next_baseline(s, APP.summarize(s)))
        s.append_many([User(text="open", key="open-0"), Assistant(text="a")])


def _files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_fork_offline_shares_epochs_by_hard_link_and_verifies_opens_and_finds_old_keys(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _home_of_three_sealed_epochs(home)
    origin, fork = home / "sessions" / "a", home / "sessions" / "b"
    before = _files(origin)
    done = loopd("fork", "a", "b", "--epoch", "1", "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert "forked a as b from epoch 1" in done.stdout
    for name in ("0.jsonl", "1.jsonl", "0.baseline.json", "1.baseline.json"):
        assert (fork / name).read_bytes() == (origin / name).read_bytes()
        assert (fork / name).stat().st_ino == (origin / name).stat().st_ino  # linked
    assert _files(origin) == before  # ID unchanged
    assert not (fork / "3.jsonl").exists()
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout
    assert "ok       b  epoch 2" in verified.stdout
    state = load_session(str(fork), "b", history=True)
    start = state.records[0]
    assert isinstance(start, SessionStart)
    assert (state.epoch, start.session, start.forked_from) == (2, "b", "a")
    with Session.open(home, "b") as session:
        assert session.carry is not None
        assert session.carry.startswith("epoch 1:")
        found = [session.find_key(k) for k in ("k0-0", "k1-1", "k2-0", "open-0")]
        assert [(f.epoch, f.line) if f else None for f in found] == [(0, 2), (1, 4), None, None]
        session.append_many([User(text="new", key="k2-0"), Assistant(text="b")])  # NEW's own
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout
    assert not list((home / "trash").iterdir())


def test_fork_of_an_open_epoch_is_refused_and_leaves_no_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _home_of_three_sealed_epochs(home)
    with pytest.raises(ForkError, match="epoch 3 is open \\(no EpochEnd yet\\)"):
        fork_session(home, "a", "b", 3, APP.next_baseline)  # type: ignore[arg-type]
    done = loopd("fork", "a", "b", "--epoch", "3", "--home", str(home))
    assert done.returncode == 1
    assert "fork from a sealed one (0..2)" in done.stderr
    assert not (home / "sessions" / "b").exists()


def test_fork_without_epoch_takes_the_newest_sealed_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _home_of_three_sealed_epochs(home)
    result = fork_session(home, "a", "b", None, APP.next_baseline)  # type: ignore[arg-type]
    assert result.epoch == 2
    assert load_session(result.directory, "b", history=True).epoch == 3


def test_a_fork_of_a_fork_verifies_with_each_epoch_naming_its_own_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _home_of_three_sealed_epochs(home)
    fork_session(home, "a", "b", 0, APP.next_baseline)  # type: ignore[arg-type]
    with Session.open(home, "b") as b:
        b.append_many([User(text="b1", key="b-1"), Assistant(text="a")])
        b.commit_epoch("b's", APP.next_baseline(b, "b's"))
    fork_session(home, "b", "c", 1, APP.next_baseline)  # type: ignore[arg-type]
    state = load_session(str(home / "sessions" / "c"), "c", history=True)
    assert [state.epoch, state.records[0].forked_from] == [2, "b"]  # type: ignore[union-attr]
    with Session.open(home, "c") as c:
        assert c.find_key("k0-1") is not None
        assert c.find_key("b-1") is not None


def test_verify_refuses_a_shared_epoch_that_names_another_session_than_the_fork_records(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _home_of_three_sealed_epochs(home)
    fork_session(home, "a", "b", 1, APP.next_baseline)  # type: ignore[arg-type]
    log = home / "sessions" / "b" / "2.jsonl"  # the fork's own file, not a shared one
    log.write_bytes(log.read_bytes().replace(b'"forked_from":"a"', b'"forked_from":"z"'))
    reseal_log(log)
    with pytest.raises(InvalidLog, match=r"SessionStart\.session is 'a', directory is 'z'"):
        load_session(str(home / "sessions" / "b"), "b", history=True)


def _fork_in_child(home: Path, trace: Path, at: int) -> int:
    """Fork a as b in a forked process that SIGKILLs itself at boundary ``at`` (0: never)."""
    fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pid = os.fork()
    if pid == 0:  # the child: it leaves by _exit or the kill
        code = 1
        try:
            events = EventPipe(fd)
            durable.set_hook(ChaosHook(events, FaultKind.KILL, "-", at))
            try:
                fork_session(home, "a", "b", 1, APP.next_baseline)  # type: ignore[arg-type]
                code = 0
            finally:
                events.flush()
        finally:
            os._exit(code)
    os.close(fd)
    _pid, status = os.waitpid(pid, 0)
    return status


def test_a_fork_killed_at_any_durable_step_leaves_no_new_session_or_a_whole_one(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    _home_of_three_sealed_epochs(source)
    dry = tmp_path / "dry"
    shutil.copytree(source, dry)
    assert os.waitstatus_to_exitcode(_fork_in_child(dry, tmp_path / "dry.trace", 0)) == 0
    lines = (tmp_path / "dry.trace").read_text().splitlines()
    boundaries = sum(json.loads(line).get("e") == "step" for line in lines)
    assert boundaries > 10
    origin = _files(source / "sessions" / "a")
    for at in range(1, boundaries + 1):
        home = tmp_path / f"at-{at}"
        shutil.copytree(source, home)
        status = _fork_in_child(home, tmp_path / f"at-{at}.trace", at)
        assert os.WIFSIGNALED(status), at
        assert os.WTERMSIG(status) == signal.SIGKILL, at
        fork = home / "sessions" / "b"
        if fork.exists():  # the rename was done: whole
            assert load_session(str(fork), "b", history=True).epoch == 2, at
        assert _files(home / "sessions" / "a") == origin, at
        # A rerun forks (the remains of the killed one are in the trash, never in NEW).
        if not fork.exists():
            fork_session(home, "a", "b", 1, APP.next_baseline)  # type: ignore[arg-type]
            assert load_session(str(fork), "b", history=True).epoch == 2, at


def test_fork_of_a_live_session_serves_old_keys_from_its_log_while_the_origin_keeps_serving(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "30"), Client(str(home)) as client:
        call(str(home), "create", session="a")
        outcomes = [client.send("a", "x" * 80, key=f"k{n}") for n in range(4)]
        assert [o["epoch"] for o in outcomes] == [0, 1, 2, 3]  # each request commits
        done = loopd("fork", "a", "b", "--epoch", "1", "--home", str(home))
        assert done.returncode == 0, done.stderr
        assert loopd("start", "b", "--home", str(home)).returncode == 0
        again = client.send("b", "x" * 80, key="k1")
        assert (again["duplicate"], again["epoch"]) == (True, 1)  # from NEW's shared log
        fresh = client.send("b", "y", key="k2")  # applied in a's epoch 2, not in b's
        assert fresh["duplicate"] is False
        assert client.send("a", "z", key="k4")["duplicate"] is False  # a keeps serving
        assert client.send("a", "z", key="k2")["duplicate"] is True
        wait_state(home, "b", "RUNNING")
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout


def test_a_fork_carries_the_schedules_pending_at_its_epoch_as_a_resume_does(
    tmp_path: Path,
) -> None:
    """NEW's first epoch held only its SessionStart: the parent's acknowledged schedules
    were never delivered in the fork (nothing said so; verify passed)."""
    home = tmp_path / "home"
    with Session.create(home, "p1", APP.initial_baseline("p1")) as s:
        s.append_many([User(text="t", key="k0"), Assistant(text="a")])
        s.append_many([
            Schedule(key="L1", at="2030-01-01T00:00:00.000000Z", text="later"),
            Schedule(key="L2", at="2030-01-02T00:00:00.000000Z", text="soon"),
        ])  # fmt: skip
        s.commit_epoch(APP.summarize(s), APP.next_baseline(s, APP.summarize(s)))
        parent = [r for r in s.records if isinstance(r, Schedule)]
    result = fork_session(home, "p1", "pf", None, APP.next_baseline)  # type: ignore[arg-type]
    forked = load_session(result.directory, "pf", history=True)
    assert [r for r in forked.records if isinstance(r, Schedule)] == parent
    assert sorted(pending_schedules(forked.records)) == ["L1", "L2"]
