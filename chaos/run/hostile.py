"""The hostile disk: what no crash leaves, planted after a kill, and never served.

A case kills the worker at boundary k as ``kill`` does, then makes the disk hostile:
a symbolic link (to a file outside the home) where step k was to create its file; a
FIFO in place of the newest log or a socket in place of its baseline; a whole line of
the newest log with a trailing space or its keys in another order; a group commit of
it with its middle part cut out; a damaged line in a group before the last. Then a
resumed client, ``verify`` and ``repair`` each try the session in a child of their own
(the mutant applied, an alarm against a reader that blocks).

``hostile-refused-unchanged``: every damaged session is refused by all three, with one
line that names the file (and the line the rig damaged, for a damaged line), never
served, and every file under the home is byte-identical (and of the same type) after
each try; a planted link is never written through (its target outside the home is
unchanged) and never replaced by a file of the store's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from chaos import mutants
from chaos.cases import Case, CaseResult
from chaos.faults.hook import FaultKind
from chaos.lifeline import die_with_parent
from chaos.oracle.oracle import ClientLog, log_files
from chaos.run.child import open_for_resume
from chaos.run.worker_run import fork_child
from chaos.scenarios.scenarios import SCENARIOS, SESSION, Scenario, apply_op
from worker.offline.repair import repair_torn_tail
from worker.store.errors import SessionError
from worker.store.inspection import inspect_session

INVARIANT: Final = "hostile-refused-unchanged"
ALARM_S: Final = 20  # a try that has not ended by then blocks (a FIFO read): a violation
OUTSIDE: Final = b"a file outside the home that no session may write\n"


@dataclass(frozen=True, slots=True)
class Planted:
    """What was made hostile: the file (and lines) a refusal must name, or a link."""

    path: str
    lines: frozenset[int] = frozenset()  # empty: the refusal names the file, not a line
    target: str | None = None  # a planted link's target, outside the home
    # When every damaged line is in the log's last group: the line it starts at, and the
    # log's hostile bytes (repair may move that group into quarantine, and nothing else).
    tail_from: int | None = None
    data: bytes = b""


def run_hostile_case(case: Case, workdir: str) -> CaseResult:
    """Kill at boundary ``case.at``, plant ``case.variant``, and try the session thrice."""
    scenario = SCENARIOS[case.scenario]
    result = CaseResult(case=case.id, fault=case.fault.value, boundary="", app=case.app)
    root = tempfile.mkdtemp(prefix="case-", dir=workdir)
    home = os.path.abspath(os.path.join(root, "home"))
    os.mkdir(home)
    if scenario.prepare is not None:
        scenario.prepare(home)
    log = ClientLog()
    run = fork_child(home, scenario, log, resume=False, fault=FaultKind.HOSTILE,
                     variant=case.variant, at=case.at, mutant=case.mutant)  # fmt: skip
    step = run.steps[-1] if run.steps and run.steps[-1].get("k") == case.at else {}
    result.boundary = f"{step.get('step')} {os.path.basename(str(step.get('path')))}"
    planted = plant(home, case.variant, str(step.get("path", "")), root)
    if planted is None:
        result.notes.append(f"nothing to make {case.variant} on this disk")
        return result
    result.checked.append(INVARIANT)
    result.notes.append(f"planted {case.variant} at {planted.path}")
    tries: list[tuple[str, Callable[[], object]]] = [
        ("a resumed client", lambda: _resume(home, scenario, log.acked)),
        ("verify", lambda: inspect_session(home, SESSION, history=True)),
        ("repair", lambda: repair_torn_tail(home, SESSION)),
    ]
    for who, attempt in tries:
        before = _files(home)
        outcome = _in_child(attempt, case.mutant)
        if planted.target is not None:
            _judge_link(result, planted, who, outcome)
            break  # the resume may write the session's own files: only the link is judged
        if who == "repair" and "served" in outcome and planted.tail_from is not None:
            _judge_cut(result, planted, before, _files(home))
        else:
            _judge_refusal(result, planted, who, outcome)
            if _files(home) != before:
                result.violate(INVARIANT, f"{who} changed the files of a session it refused")
        if result.violations:
            break
    return result


def _resume(home: str, scenario: Scenario, acked: set[str]) -> None:
    session = open_for_resume(home, scenario)
    for op in scenario.ops:
        if not (op.key and op.key in acked):
            session = apply_op(session, home, op, retry=True)
    session.close()


def _judge_refusal(result: CaseResult, planted: Planted, who: str, outcome: dict[str, str]) -> None:
    why = outcome.get("refused")
    if why is None:
        result.violate(INVARIANT, f"{who} served the hostile {planted.path}: {outcome}")
        return
    if not why or "\n" in why or "Traceback" in why:
        result.violate(INVARIANT, f"{who} refused without one line: {why!r}")
        return
    if not planted.lines and planted.path not in why:
        result.violate(INVARIANT, f"{who} refused with {why!r}, which does not name {planted.path}")
    elif planted.lines and who != "repair":
        places = [f"{planted.path}:{line}: " for line in sorted(planted.lines)]
        if not any(place in why for place in places):
            result.violate(INVARIANT, f"{who} refused with {why!r}, not at {' or '.join(places)}")


def _judge_cut(
    result: CaseResult,
    planted: Planted,
    before: dict[str, tuple[int, str]],
    after: dict[str, tuple[int, str]],
) -> None:
    """A repair of a damaged last group: that group cut off, kept in quarantine, no more."""
    assert planted.tail_from is not None
    kept = b"".join(line + b"\n" for line in planted.data.split(b"\n")[: planted.tail_from - 1])
    with open(planted.path, "rb") as f:
        if f.read() != kept:
            result.violate(INVARIANT, f"repair cut {planted.path} elsewhere than its last group")
    cut = planted.data[len(kept) :]
    moved = [p for p in after if p not in before and after[p][1] == hashlib.sha256(cut).hexdigest()]
    if not moved:
        result.violate(INVARIANT, "repair did not keep the group it cut in quarantine")
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    if changed - {planted.path, *moved} - {p for p in after if "quarantine" in p}:
        result.violate(INVARIANT, f"repair changed more than {planted.path}: {sorted(changed)}")


def _judge_link(result: CaseResult, planted: Planted, who: str, outcome: dict[str, str]) -> None:
    assert planted.target is not None
    with open(planted.target, "rb") as f:
        if f.read() != OUTSIDE:
            result.violate(INVARIANT, f"{who} wrote through the link {planted.path}")
    if os.path.lexists(planted.path) and not os.path.islink(planted.path):
        result.violate(INVARIANT, f"{who} replaced the link {planted.path} with a file")
    why = outcome.get("refused")
    if why is not None and ("\n" in why or "Traceback" in why or not why):
        result.violate(INVARIANT, f"{who} refused without one line: {why!r}")


def _in_child(attempt: Callable[[], object], mutant: str | None) -> dict[str, str]:
    """Run ``attempt`` in a forked child (with the mutant); what it said: served or refused."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            die_with_parent(parent)  # a kill of the rig ends it too
            os.close(read_end)
            mutants.apply(mutant)
            signal.alarm(ALARM_S)
            try:
                attempt()
            except SessionError as exc:
                said = {"refused": str(exc), "error": type(exc).__name__}
            except Exception as exc:  # noqa: BLE001 - the rig reports what escaped
                said = {"crashed": f"{type(exc).__name__}: {exc}"}
            else:
                said = {"served": "yes"}
            os.write(write_end, json.dumps(said).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
    finally:
        os.close(read_end)
        _pid, status = os.waitpid(pid, 0)
    if not data:
        return {"crashed": f"the try ended with status {os.waitstatus_to_exitcode(status)}"}
    told: dict[str, str] = json.loads(data)
    return told


def _files(home: str) -> dict[str, tuple[int, str]]:
    """Every entry under ``home``: its type and, for a regular file, its SHA-256."""
    found: dict[str, tuple[int, str]] = {}
    for directory, dirs, names in os.walk(home):
        for name in dirs + names:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            digest = ""
            if stat.S_ISREG(mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            found[path] = (stat.S_IFMT(mode), digest)
    return found


def plant(home: str, variant: str, step_path: str, root: str) -> Planted | None:
    """Make the disk hostile as ``variant`` says; None when this disk has nothing for it."""
    if variant == "link":
        if not step_path:
            return None
        target = os.path.join(root, "outside.txt")
        with open(target, "wb") as f:
            f.write(OUTSIDE)
        if os.path.lexists(step_path):
            os.unlink(step_path)
        os.symlink(target, step_path)
        return Planted(step_path, target=target)
    logs = [p for p in log_files(home) if os.path.getsize(p) > 0]
    if not logs:
        return None
    newest = logs[-1]
    if variant == "fifo":
        os.unlink(newest)
        os.mkfifo(newest, 0o600)
        return Planted(newest)
    if variant == "socket":
        return _socket_for_baseline(newest)
    with open(newest, "rb") as f:
        lines = f.read().split(b"\n")[:-1]
    changed = _damage(lines, variant)
    if changed is None:
        return None
    new_lines, places = changed
    data = b"".join(line + b"\n" for line in new_lines)
    with open(newest, "wb") as f:
        f.write(data)
    last = _last_group_start(new_lines) + 1
    tail = last if min(places) >= last > 1 else None
    return Planted(newest, lines=frozenset(places), tail_from=tail, data=data)


def _damage(lines: list[bytes], variant: str) -> tuple[list[bytes], set[int]] | None:
    """The log's lines made hostile, and the lines (from 1) a refusal may name."""
    last = len(lines)
    # A line before the last group (the SessionStart at worst): repair must refuse it.
    at = max(_last_group_start(lines) - 1, 0)
    if variant == "space":
        return [*lines[:at], lines[at] + b" ", *lines[at + 1 :]], {at + 1}
    if variant == "reordered":
        record = json.loads(lines[at])
        turned = json.dumps(dict(reversed(record.items())), separators=(",", ":")).encode()
        return [*lines[:at], turned, *lines[at + 1 :]], {at + 1}
    groups = _groups(lines)
    if variant == "gap":
        whole = [(first, end) for first, end in groups if end - first >= 3]
        if not whole:
            return None
        first, end = whole[-1]
        middle = first + 1
        return lines[:middle] + lines[middle + 1 :], set(range(first + 1, end))
    if variant == "earlier":
        earlier = [(first, end) for first, end in groups if end < last]
        if not earlier:
            return None
        first, _end = earlier[0]
        line = lines[first + 1]
        return [*lines[: first + 1], line[:-1] + b"]", *lines[first + 2 :]], {first + 2}
    raise ValueError(f"unknown hostile variant {variant!r}")


def _last_group_start(lines: list[bytes]) -> int:
    """The index of the first line of the log's last group (a lone line is one)."""
    for first, end in _groups(lines):
        if end == len(lines):
            return first
    return len(lines) - 1


def _groups(lines: list[bytes]) -> list[tuple[int, int]]:
    """The group commits among ``lines``: (index of the first line, index past the last)."""
    groups = []
    for index, line in enumerate(lines):
        if b'"part":1,' in line:
            parts = json.loads(line).get("parts")
            if isinstance(parts, int) and index + parts <= len(lines):
                groups.append((index, index + parts))
    return groups


def _socket_for_baseline(newest_log: str) -> Planted | None:
    baseline = newest_log[: -len(".jsonl")] + ".baseline.json"
    if not os.path.exists(baseline):
        return None
    os.unlink(baseline)
    here = os.getcwd()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(os.path.dirname(baseline))  # a socket's path must be short: bind it relative
        server.bind(os.path.basename(baseline))
    finally:
        os.chdir(here)
        server.close()
    return Planted(baseline)


__all__ = ["INVARIANT", "plant", "run_hostile_case"]
