"""The invariant of salvage (the ``salvage`` scenario), read from the files.

- ``salvage-keeps-the-prefix``: whatever the fault left, not a byte of the damaged
  session's logs and baselines is lost: each is in the session as prepared, or in its
  quarantine whole, or (the log salvage cuts) its kept prefix in the session and the
  rest in the quarantine's ``.cut`` file. The session itself is as damaged (untouched),
  or holds salvage's plan (cut short: the rerun finishes it), or is exactly what the
  real salvage makes of the damaged files, run here on a copy (epoch 0, and epoch 1 up
  to the group before the damage). Once the salvage was acknowledged, and after the
  resume (the salvage run again), it is that, with no plan left, and it opens.

What it cannot see: the key index files salvage rebuilds (``key-index-finds-every-key``
checks a rebuild in the ``operator-tools`` scenario), and what salvage reports.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Final

from chaos.cases import CaseResult
from chaos.oracle.tool_checks import acknowledged
from chaos.scenarios.operator_tools import store_files
from chaos.scenarios.salvage_tool import ORIGINAL, SALVAGE, VICTIM, quarantine_dir, victim_dir
from chaos.scenarios.scenarios import Scenario
from worker.offline.salvage import salvage_session
from worker.offline.salvage_plan import PLAN_NAME
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionError
from worker.store.loader import load_session

KEEPS: Final = "salvage-keeps-the-prefix"


def drives_salvage(scenario: Scenario) -> bool:
    return any(op.kind == SALVAGE for op in scenario.ops)


def after_fault(result: CaseResult, scenario: Scenario, acked: set[str], home: str) -> None:
    """What the fault (or the power loss) left of the salvage must hold."""
    _check(result, home, done=acknowledged(scenario, SALVAGE, acked))


def final(result: CaseResult, home: str) -> None:
    """After the resume ran the salvage again: the session is salvaged and opens."""
    _check(result, home, done=True)


def _check(result: CaseResult, home: str, *, done: bool) -> None:
    result.checked.append(KEEPS)
    original = store_files(os.path.join(home, ORIGINAL))
    directory = victim_dir(home)
    now = store_files(directory) if os.path.isdir(directory) else {}
    quarantined = _quarantined(home)
    lost = [n for n, data in sorted(original.items()) if not _kept(n, data, now, quarantined)]
    if lost:
        result.violate(KEEPS, f"bytes of {', '.join(lost)} are neither in {directory} nor in "
                       "its quarantine")  # fmt: skip
    planned = os.path.lexists(os.path.join(directory, PLAN_NAME))
    expected = _reference(home)
    if now == expected and not planned:
        state = "salvaged"
    elif planned:
        state = "cut short, its plan in place"
    elif now == original:
        state = "as damaged"
    else:
        names = sorted(n for n in set(now) | set(expected) if now.get(n) != expected.get(n))
        why = f"it differs from the salvaged copy in {names}"
        result.violate(KEEPS, f"{directory} is neither as damaged, nor salvaged, nor "
                       f"holding salvage's plan ({why})")  # fmt: skip
        return
    if done and state != "salvaged":
        result.violate(KEEPS, f"the salvage was acknowledged, or run again, and {directory} "
                       f"is {state}")  # fmt: skip
    elif done:
        try:
            load_session(directory, VICTIM, history=True)
        except SessionError as exc:
            result.violate(KEEPS, f"the salvaged session does not open: {exc}")


def _kept(
    name: str, data: bytes, now: dict[str, bytes], quarantined: list[dict[str, bytes]]
) -> bool:
    if now.get(name) == data or any(q.get(name) == data for q in quarantined):
        return True
    kept = now.get(name)
    return (
        kept is not None
        and data.startswith(kept)
        and any(q.get(f"{name}.cut") == data[len(kept) :] for q in quarantined)
    )


def _quarantined(home: str) -> list[dict[str, bytes]]:
    """Each salvage's quarantine directory of the victim: its files by name."""
    root = quarantine_dir(home)
    found = []
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        directory = os.path.join(root, entry)
        files = {}
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "rb") as f:
                files[name] = f.read()
        found.append(files)
    return found


def _reference(home: str) -> dict[str, bytes]:
    """What the real salvage (this process runs no mutant) makes of the damaged files."""
    scratch = tempfile.mkdtemp(prefix="salvage-reference-")
    try:
        shutil.copytree(os.path.join(home, ORIGINAL), session_dir(scratch, VICTIM))
        salvage_session(scratch, VICTIM)
        return store_files(session_dir(scratch, VICTIM))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
