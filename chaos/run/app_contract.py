"""The App contract: what a user's App must hold so that the store's guarantees hold.

Checked on every case run with ``--app``, after the crash-recovery invariants:

- ``app-request-all-or-nothing``: each keyed request's records (its ``User`` up to the
  next ``User``, ``EpochEnd`` or the end of the epoch) are one group commit, so a crash
  leaves all of them or none; after a crash each one on disk has the record types it
  had in the clean run (``keyed-request-complete`` with the learned shapes).
- ``app-resume-deterministic``: ``next_baseline(session, summary)`` is deterministic for
  a given summary. Two fresh workers (forked processes that each load the App anew, as
  a restarted worker does) each resume a copy of the final session whose log was made
  to end with ``EpochEnd`` (an interrupted epoch change, its summary recorded); both
  must write the same next baseline. ``summarize`` need not be deterministic: a model
  never answers twice alike, and the store records the summary in ``EpochEnd`` before
  anything depends on it.
- ``app-resume-uses-recorded-summary``: that resume never calls ``summarize`` (the App
  is watched), and the epoch it starts carries the recorded summary as its memory.
- ``app-retry-applied-once``: a fresh worker is sent every request of the scenario again
  with its key; each must be answered (from the log when it was applied, in any epoch),
  none applied a second time or refused.
- ``app-writes-only-its-session``: the worker's working directory and ``$HOME`` are an
  empty ``outside/`` directory; after the case it must still be empty, and the store's
  home may hold nothing but the session's directory (and ``quarantine/<session>/``,
  where the rig's own repair of a refused torn log puts the torn tail). Writes to other
  absolute paths (``/tmp``, the App's own source tree) are not seen.
- ``app-effects-once-per-key``: what the App sent the rig's effects service (its URL in
  ``LOOPD_CHAOS_EFFECTS_URL``) is applied once per request key (``chaos.oracle.effects``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Final

from chaos.cases import CaseResult
from chaos.lifeline import die_with_parent
from chaos.oracle.effects import INVARIANT as EFFECTS_INVARIANT
from chaos.oracle.effects import check_effects_once_per_key
from chaos.oracle.oracle import ClientLog, LogsView, continues_group, session_path, snapshot_logs
from chaos.run.worker_run import fork_child, outside_dir
from chaos.scenarios.scenarios import SESSION, Scenario
from worker.app import App, load_app
from worker.offline.repair import QUARANTINE_DIR
from worker.process import open_session
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.disk.scan_file import SCANS_DIR
from worker.store.errors import SessionError
from worker.store.format.records import EpochEnd, encode_appended
from worker.store.session import Session

APP_INVARIANTS: Final = (
    "app-request-all-or-nothing",
    "app-resume-deterministic",
    "app-resume-uses-recorded-summary",
    "app-retry-applied-once",
    "app-writes-only-its-session",
    EFFECTS_INVARIANT,
)
_ENDS_A_REQUEST: Final = frozenset({"User", "EpochEnd"})


def request_extents(view: LogsView) -> list[tuple[str, list[dict[str, object]]]]:
    """Each keyed request on disk and its records: its User up to the next User or
    EpochEnd, or the end of its epoch."""
    extents = []
    for _epoch, records in sorted(view.epochs.items()):
        for index, record in enumerate(records):
            key = record.get("key")
            if record.get("type") != "User" or not isinstance(key, str):
                continue
            end = index + 1
            while end < len(records) and records[end].get("type") not in _ENDS_A_REQUEST:
                end += 1
            extents.append((key, records[index:end]))
    return extents


def learned_shapes(view: LogsView) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The record types each request appended in a clean run, for ``Scenario.shapes``."""
    return tuple(
        (key, tuple(str(r.get("type")) for r in records)) for key, records in request_extents(view)
    )


def check_app_contract(result: CaseResult, scenario: Scenario, home: str, log: ClientLog) -> None:
    """Every check of the App contract on the case's final files (module doc)."""
    view = snapshot_logs(home)
    _check_one_group(result, view)
    _check_resume_deterministic(result, scenario, home)
    before = view.applied_keys()
    fork_child(home, scenario, log, resume=True, resend=True, trace=False)
    result.checked.append("app-retry-applied-once")
    after = snapshot_logs(home).applied_keys()
    if after != before:
        again = sorted({k for k in after if after.count(k) > before.count(k)})
        result.violate(
            "app-retry-applied-once",
            f"requests sent again with the same key were applied again: {again}",
        )
    if log.refused_retries:
        result.violate(
            "app-retry-applied-once",
            "requests sent again with the same key were refused, not answered from the "
            f"log: {log.refused_retries[:8]}",
        )
    _check_writes_only_its_session(result, home)
    check_effects_once_per_key(result, home)  # last: the retries above sent effects too


def _check_one_group(result: CaseResult, view: LogsView) -> None:
    result.checked.append("app-request-all-or-nothing")
    for key, records in request_extents(view):
        split = [r for r in records[:-1] if not continues_group(r)]
        if split or continues_group(records[-1]):
            types = "+".join(str(r.get("type")) for r in records)
            result.violate(
                "app-request-all-or-nothing",
                f"request {key!r} ({types}) is not one group commit: a crash can leave part",
            )


def _check_resume_deterministic(result: CaseResult, scenario: Scenario, home: str) -> None:
    """Resume an interrupted epoch change twice, each in a fresh worker (module doc)."""
    result.checked += ["app-resume-deterministic", "app-resume-uses-recorded-summary"]
    probes = _interrupted_copies(home, result.case)
    if probes is None:
        return  # nothing whole to copy: final-state-opens reports it
    summary, copies = probes
    try:
        first, second = (_resumed(copy, home, scenario) for copy in copies)
    finally:
        shutil.rmtree(os.path.dirname(copies[0]), ignore_errors=True)
    if "unopenable" in first or "unopenable" in second:
        return
    if "error" in first or "error" in second:
        result.violate(
            "app-resume-deterministic",
            f"a fresh worker's App failed to resume an interrupted epoch change: "
            f"{first.get('error') or second.get('error')}",
        )
        return
    for answer in (first, second):
        if answer["summarize_calls"] != "0":
            result.violate(
                "app-resume-uses-recorded-summary",
                f"a resume after EpochEnd called summarize {answer['summarize_calls']} "
                "time(s): it must use the recorded summary",
            )
            break
        if answer["memory"] != summary:
            result.violate(
                "app-resume-uses-recorded-summary",
                f"the resumed epoch starts from memory {answer['memory'][:120]!r}, "
                f"not the recorded summary {summary[:120]!r}",
            )
            break
    if "no" in (first["watched"], second["watched"]):
        result.notes.append("summarize could not be watched: the App takes no attribute")
    if first["baseline"] != second["baseline"]:
        result.violate(
            "app-resume-deterministic",
            "two fresh workers resuming the same recorded summary built different next "
            f"baselines: {first['baseline'][:120]!r} and {second['baseline'][:120]!r}",
        )


def _interrupted_copies(home: str, case: str) -> tuple[str, tuple[str, str]] | None:
    """Two copies of the final session (beside the home, outside what the App may write)
    whose newest log ends with ``EpochEnd``: the recorded summary and the copies' homes.

    A log that already ends with one keeps it; else the rig records a summary of its own
    that no ``summarize`` would write.
    """
    view = snapshot_logs(home)
    if not view.epochs:
        return None
    newest = max(view.epochs)
    raw = view.raw[newest]
    if not raw.endswith(b"\n"):
        return None
    summary = view.closing_summary(newest)
    line = b""
    if summary is None:
        summary = f"the summary recorded before the crash of {case}"
        line = encode_appended(raw, EpochEnd(next=newest + 1, summary=summary))
    root = tempfile.mkdtemp(prefix="resume-probe-", dir=os.path.dirname(os.path.abspath(home)))
    copies = []
    for name in ("first", "second"):
        copy = os.path.join(root, name)
        shutil.copytree(session_path(home), os.path.join(copy, SESSIONS_DIR, SESSION))
        with open(os.path.join(copy, SESSIONS_DIR, SESSION, f"{newest}.jsonl"), "ab") as f:
            f.write(line)
        copies.append(copy)
    return summary, (copies[0], copies[1])


def _resumed(copy: str, home: str, scenario: Scenario) -> dict[str, str]:
    """What a freshly loaded App's worker does resuming ``copy``, in a forked process:
    the worker's own resume (``worker.process.open_session``) with ``summarize`` watched."""
    assert scenario.app is not None
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            die_with_parent(parent)  # a kill of the rig ends it too
            os.close(read_end)
            os.chdir(outside_dir(home))  # what the App writes in its cwd is still seen
            answer: dict[str, str]
            try:
                app = load_app(scenario.app, scenario.budget)
                calls, watched = _watch_summarize(app)
                args = argparse.Namespace(home=copy, session=SESSION, create=False, slot=0)
                try:
                    session = open_session(args, app)
                except SessionError as exc:
                    answer = {"unopenable": str(exc)}  # final-state-opens reports it
                else:
                    with session:
                        answer = {
                            "summarize_calls": str(len(calls)),
                            "watched": "yes" if watched else "no",
                            "memory": session.baseline.memory,
                            "baseline": session.baseline.to_json().decode(),
                        }
            except Exception as exc:  # noqa: BLE001 - any failure of the App is the finding
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write_end, json.dumps(answer).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    try:
        while chunk := os.read(read_end, 65536):
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    try:
        answer = json.loads(data)
    except ValueError:
        return {"error": "the child died before it answered"}
    return {str(k): str(v) for k, v in answer.items()}


def _watch_summarize(app: App) -> tuple[list[None], bool]:
    """Count the App's ``summarize`` calls (its own ``self.summarize`` ones included)."""
    calls: list[None] = []
    original = app.summarize

    def watched(session: Session) -> str:
        calls.append(None)
        return original(session)

    try:
        object.__setattr__(app, "summarize", watched)
    except (AttributeError, TypeError):
        return calls, False  # __slots__ without room for it: memory is still checked
    return calls, True


def _check_writes_only_its_session(result: CaseResult, home: str) -> None:
    result.checked.append("app-writes-only-its-session")
    outside = outside_dir(home)
    strays = [os.path.relpath(p, outside) for p in _walk(outside)]
    allowed = [os.path.join(home, d, SESSION) for d in (SESSIONS_DIR, QUARANTINE_DIR)]
    parents = {os.path.dirname(a) for a in allowed}
    # The store's cache of open's scan of the session (and a temporary of it), never
    # any other file under scans/.
    scans = os.path.join(home, SCANS_DIR)
    if os.path.isdir(scans) and not os.path.islink(scans):
        parents.add(scans)
    strays += [
        os.path.relpath(p, home)
        for p in _walk(home)
        if p not in parents
        and not any((p + os.sep).startswith(a + os.sep) for a in allowed)
        and not _summary_of_the_session(scans, p)
    ]
    if strays:
        result.violate(
            "app-writes-only-its-session",
            f"files written outside the session's directory: {sorted(strays)[:8]}",
        )


def _summary_of_the_session(scans: str, path: str) -> bool:
    name = os.path.basename(path)
    if os.path.dirname(path) != scans or not os.path.isfile(path) or os.path.islink(path):
        return False
    return name in (f"{SESSION}.scan", f".{SESSION}.scan.tmp")


def _walk(top: str) -> list[str]:
    """Every file and directory under ``top`` (not ``top`` itself)."""
    paths = []
    for directory, dirs, files in os.walk(top):
        paths += [os.path.join(directory, n) for n in dirs + files]
    return paths
