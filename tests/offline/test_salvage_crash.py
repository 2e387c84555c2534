"""``loopd salvage`` killed at each of its durable steps, with and without a power loss
after the kill: a rerun finishes it, reports every key the interrupted run cut, and
leaves a session that verifies and opens, with no gap in its epochs and nothing lost.

The kill is a real SIGKILL of a forked process at the store's write boundary (the
chaos rig's hook); the power loss rewrites the home to what the crash-consistency model
of chaos.faults.model (ALICE, LazyFS) says the completed steps made durable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from chaos.faults.hook import ChaosHook, EventPipe, FaultKind
from chaos.faults.model import DurableModel, PowerVariant
from tests.harness.support import loopd
from worker import Assistant, Session, User
from worker.app import DefaultApp
from worker.offline.salvage import SalvageRefused, SalvageResult, salvage_session
from worker.store.disk import durable
from worker.store.errors import SessionError
from worker.store.loader import list_epochs, load_session

SESSION = "s1"


def _damaged_home(home: Path) -> list[str]:
    """A session of four epochs with a line of sealed epoch 1 flipped; its User keys."""
    baseline = DefaultApp().initial_baseline(SESSION)
    keys = []
    with Session.create(home, SESSION, baseline) as session:
        for epoch in range(4):
            for k in range(3):
                key = f"k{epoch}-{k}"
                keys.append(key)
                session.append_many([User(text=f"topic {epoch} {k}", key=key), Assistant(text="a")])
            if epoch < 3:
                session.commit_epoch(f"sum {epoch}", baseline)
    log = home / "sessions" / SESSION / "1.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines[3] = b"!" + lines[3][1:]  # the second request of epoch 1: damage mid-history
    log.write_bytes(b"\n".join(lines))
    return keys


def _salvage_in_child(home: Path, trace: Path, at: int) -> int:
    """Run salvage in a forked process that SIGKILLs itself at boundary ``at`` (0: never);
    the boundaries it passed are traced to ``trace``. Returns the wait status."""
    fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's runs here, it leaves by _exit or the kill
        code = 1
        try:
            events = EventPipe(fd)
            durable.set_hook(ChaosHook(events, FaultKind.KILL, "-", at))
            try:
                salvage_session(home, SESSION)
                code = 0
            finally:
                events.flush()
        finally:
            os._exit(code)
    os.close(fd)
    _pid, status = os.waitpid(pid, 0)
    return status


def _steps(trace: Path) -> list[dict[str, object]]:
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return [e for e in events if e.get("e") == "step"]


def _keys_in(directory: Path) -> set[str]:
    found = set()
    for path in directory.rglob("*"):
        if path.is_file():
            found.update(re.findall(rb'"key":"(k[0-9]+-[0-9]+)"', path.read_bytes()))
    return {k.decode() for k in found}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], set[str], int]:
    """The damaged home, its keys, the keys a whole salvage cuts, and its boundary count."""
    root = tmp_path_factory.mktemp("salvage-template")
    home = root / "home"
    keys = _damaged_home(home)
    dry = root / "dry"
    shutil.copytree(home, dry)
    status = _salvage_in_child(dry, root / "dry.trace", 0)
    assert os.waitstatus_to_exitcode(status) == 0
    whole = root / "whole"
    shutil.copytree(home, whole)
    cut = {key for c in salvage_session(whole, SESSION).cuts for key in c.keys}
    # k1-1's line is the damaged one: its key cannot be read, only counted.
    assert cut == {"k1-2", "k2-0", "k2-1", "k2-2", "k3-0", "k3-1", "k3-2"}
    return home, keys, cut, len(_steps(root / "dry.trace"))


def _rerun(home: Path) -> SalvageResult | str:
    """The rerun's result, or the reason it gave for refusing."""
    try:
        return salvage_session(home, SESSION)
    except SalvageRefused as exc:
        return exc.why


def _kept_keys(home: Path) -> set[str]:
    return _keys_in(home / "sessions" / SESSION)


VARIANTS = ["kill", "power-drop", "power-names", "power-zeros"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_salvage_killed_at_any_step_is_finished_by_a_rerun_that_reports_every_cut_key(
    tmp_path: Path, template: tuple[Path, list[str], set[str], int], variant: str
) -> None:
    source, keys, cut, boundaries = template
    assert boundaries > 10
    for at in range(1, boundaries + 1):
        home = tmp_path / f"at-{at}"
        shutil.copytree(source, home)
        model = DurableModel.snapshot(str(home))
        trace = tmp_path / f"at-{at}.trace"
        status = _salvage_in_child(home, trace, at)
        assert os.WIFSIGNALED(status), (at, status)
        assert os.WTERMSIG(status) == signal.SIGKILL, (at, status)
        if variant != "kill":
            for step in _steps(trace):
                model.apply(step)
            model.power_loss(PowerVariant(variant.removeprefix("power-")))
        where = f"{variant} at boundary {at} of {boundaries}"
        result = _rerun(home)
        if isinstance(result, str):
            # The killed run finished all but its report: the rerun names what it cut.
            assert "opens cleanly: nothing to salvage" in result, (where, result)
            reported = set(re.findall(r"k[0-9]+-[0-9]+", result.split("keys cut", 1)[-1]))
        else:
            reported = {key for c in result.cuts for key in c.keys}
        assert reported == cut, where
        directory = str(home / "sessions" / SESSION)
        assert list_epochs(directory) == [0, 1], where  # no gap, nothing later left
        try:
            load_session(directory, SESSION, history=True)
            Session.open(home, SESSION).close()
        except SessionError as exc:
            raise AssertionError(f"{where}: {exc}") from exc
        assert _kept_keys(home) == set(keys) - cut - {"k1-1"}, where
        assert _keys_in(home / "quarantine" / SESSION) >= cut | {"k1-1"}, where  # nothing lost


def test_verify_names_an_interrupted_salvage_and_the_cli_rerun_lists_what_it_cut(
    tmp_path: Path, template: tuple[Path, list[str], set[str], int]
) -> None:
    source, _keys, cut, _boundaries = template
    home = tmp_path / "home"
    shutil.copytree(source, home)
    dry = _steps_of_a_whole_run(tmp_path, source)
    renames = [k for k, step in enumerate(dry, start=1) if step["step"] == "rename"]
    status = _salvage_in_child(home, tmp_path / "run.trace", renames[2])  # mid-way
    assert os.WIFSIGNALED(status)
    verify = loopd("verify", "--home", str(home))
    assert verify.returncode == 1
    assert "interrupted `loopd salvage`" in verify.stdout, verify.stdout
    assert "gap in epochs" not in verify.stdout
    start = loopd("inspect", "--home", str(home), SESSION)
    assert "interrupted `loopd salvage`" in start.stderr, start.stderr
    said = loopd("salvage", "--home", str(home), SESSION)
    assert said.returncode == 0, said.stderr
    assert "finished an interrupted salvage" in said.stdout
    listed = said.stdout.split("keys cut (7): ", 1)[1].split("\n", 1)[0]
    assert set(re.findall(r"k[0-9]+-[0-9]+", listed)) == cut
    assert "0 refused" in loopd("verify", "--home", str(home)).stdout


def _steps_of_a_whole_run(tmp_path: Path, source: Path) -> list[dict[str, object]]:
    dry = tmp_path / "dry"
    shutil.copytree(source, dry)
    assert os.waitstatus_to_exitcode(_salvage_in_child(dry, tmp_path / "dry.trace", 0)) == 0
    return _steps(tmp_path / "dry.trace")
