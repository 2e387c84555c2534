"""The invariants of the operator's tools (the ``operator-tools`` scenario), read from the files.

- ``backup-complete-or-refused``: a backup directory (``DEST/ID``, renamed into place
  after its manifest) is whole: its manifest checks and its logs hold every request
  acknowledged before the backup began; one whose backup was acknowledged is there. A
  backup cut short (``DEST/ID.partial``) is refused by restore, or is whole: never
  taken as a smaller good one. Restore of it is tried in a forked process with the
  case's mutant, into a scratch home outside the case.
- ``tool-rerun-completes``: a restored copy is either absent or exactly the backup
  (every log and baseline, byte for byte): never a half session; one whose restore
  was acknowledged is there; after the resume (each tool run again) it is there and
  reads whole, as ``loopd verify`` reads it.
- ``key-index-finds-every-key``: once the key index rebuild of the copy was
  acknowledged (and after the resume), the copy opens and ``find_key`` finds every
  key the backup holds, in every epoch, and not a key never sent.

A tool is acknowledged when a request after it in the scenario was: the client runs
the operations in order.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Final

from chaos import mutants
from chaos.cases import Case, CaseResult
from chaos.lifeline import die_with_parent
from chaos.scenarios.operator_tools import (
    BACKUP,
    REBUILD_INDEX,
    RESTORE,
    TOOL_KINDS,
    backup_dir,
    restored_home,
    store_files,
)
from chaos.scenarios.salvage_tool import SALVAGE
from chaos.scenarios.scenarios import SESSION, Scenario
from worker.offline.backup import PARTIAL, BackupError
from worker.offline.restore import check_backup, restore_session
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionError
from worker.store.loader import load_session
from worker.store.session import Session

BACKUP_WHOLE: Final = "backup-complete-or-refused"
RERUN: Final = "tool-rerun-completes"
INDEX: Final = "key-index-finds-every-key"
NEVER_SENT: Final = "never-sent-to-this-session"


def drives_tools(scenario: Scenario) -> bool:
    return any(op.kind in TOOL_KINDS - {SALVAGE} for op in scenario.ops)


def _keys_before(scenario: Scenario, kind: str) -> set[str]:
    """The request keys the scenario sends before its first ``kind`` operation."""
    keys: set[str] = set()
    for op in scenario.ops:
        if op.kind == kind:
            return keys
        if op.key:
            keys.add(op.key)
    return keys


def acknowledged(scenario: Scenario, kind: str, acked: set[str]) -> bool:
    """Whether a request sent after the ``kind`` operation was acknowledged."""
    after = False
    for op in scenario.ops:
        after = after or op.kind == kind
        if after and op.key and op.key in acked:
            return True
    return False


def _log_keys(files: dict[str, bytes]) -> set[str]:
    """The keys of the User records in the logs among ``files`` (raw, whole lines only)."""
    keys: set[str] = set()
    for name, data in files.items():
        if not name.endswith(".jsonl"):
            continue
        for line in data.split(b"\n")[:-1]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("type") == "User" and record.get("key"):
                keys.add(str(record["key"]))
    return keys


def after_fault(result: CaseResult, scenario: Scenario, acked: set[str], home: str) -> None:
    """What the fault (or the power loss) left of the tools' work must hold."""
    mutant = Case.parse(result.case).mutant
    backup = _check_backup(result, scenario, acked, home, mutant)
    _check_restored(result, scenario, acked, home, backup, final=False)
    if acknowledged(scenario, REBUILD_INDEX, acked):
        _check_index(result, home, backup)


def final(result: CaseResult, scenario: Scenario, acked: set[str], home: str) -> None:
    """After the resume ran every tool again: the copy is the backup, and finds its keys."""
    backup = _check_backup(result, scenario, acked, home, None)
    _check_restored(result, scenario, acked, home, backup, final=True)
    _check_index(result, home, backup)


def _check_backup(
    result: CaseResult, scenario: Scenario, acked: set[str], home: str, mutant: str | None
) -> dict[str, bytes] | None:
    """Check the backup directory and any backup cut short; return the backup's files."""
    result.checked.append(BACKUP_WHOLE)
    target = backup_dir(home, SESSION)
    wanted = _keys_before(scenario, BACKUP)
    partial = target + PARTIAL
    if os.path.lexists(partial):
        taken = _restore_elsewhere(partial, mutant)
        if taken is not None and not wanted <= _log_keys(taken):
            result.violate(
                BACKUP_WHOLE,
                f"a backup cut short was restored as a smaller one: it lacks "
                f"{sorted(wanted - _log_keys(taken))}",
            )
    if not os.path.lexists(target):
        if acknowledged(scenario, BACKUP, acked):
            result.violate(BACKUP_WHOLE, f"the acknowledged backup {target} is gone")
        return None
    try:
        files = check_backup(target).files
    except BackupError as exc:
        result.violate(BACKUP_WHOLE, f"a backup directory with its manifest is refused: {exc}")
        return None
    missing = sorted(wanted - _log_keys(files))
    if missing:
        result.violate(BACKUP_WHOLE, f"the backup lacks requests acknowledged before it: {missing}")
    return files


def _restore_elsewhere(source: str, mutant: str | None) -> dict[str, bytes] | None:
    """Restore ``source`` into a scratch home, as the store under test does (in a forked
    process with ``mutant``); the restored logs and baselines, or None if refused."""
    scratch = tempfile.mkdtemp(prefix="tool-check-")
    try:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the restore: never returns
            code = 2
            try:
                die_with_parent(parent)
                mutants.apply(mutant)
                try:
                    restore_session(scratch, source, SESSION, replace=False)
                    code = 0
                except SessionError:
                    code = 1
            finally:
                os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        return store_files(session_dir(scratch, SESSION))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_restored(
    result: CaseResult,
    scenario: Scenario,
    acked: set[str],
    home: str,
    backup: dict[str, bytes] | None,
    *,
    final: bool,
) -> None:
    result.checked.append(RERUN)
    directory = session_dir(restored_home(home), SESSION)
    if not os.path.lexists(directory):
        if final or acknowledged(scenario, RESTORE, acked):
            result.violate(RERUN, f"the acknowledged restore left no session at {directory}")
        return
    if backup is None:
        return  # nothing to compare with (its absence is the backup check's)
    held = {n: d for n, d in backup.items() if n.endswith((".jsonl", ".baseline.json"))}
    restored = store_files(directory)
    if restored != held:
        lacking = sorted(set(held) - set(restored))
        differing = sorted(n for n in set(held) & set(restored) if held[n] != restored[n])
        result.violate(
            RERUN,
            f"the restored session is not the backup: lacks {lacking}, differs in "
            f"{differing}, has {sorted(set(restored) - set(held))} besides",
        )
        return
    if final:
        try:
            load_session(directory, SESSION, history=True)
        except SessionError as exc:
            result.violate(RERUN, f"after every tool ran again the copy is refused: {exc}")


def _check_index(result: CaseResult, home: str, backup: dict[str, bytes] | None) -> None:
    result.checked.append(INDEX)
    if backup is None:
        return
    try:
        session = Session.open(restored_home(home), SESSION)
    except SessionError as exc:
        result.violate(INDEX, f"after the key index rebuild the copy does not open: {exc}")
        return
    try:
        lost = sorted(k for k in _log_keys(backup) if session.find_key(k) is None)
        found = session.find_key(NEVER_SENT)
    except SessionError as exc:
        result.violate(INDEX, f"a key look-up in the copy failed: {exc}")
        return
    finally:
        session.close()
    if lost:
        result.violate(INDEX, f"find_key finds no trace of applied keys: {lost}")
    if found is not None:
        result.violate(INDEX, f"find_key finds a key never sent, at {found}")
