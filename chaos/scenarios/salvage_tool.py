"""Salvage as an operator runs it, cut short by the case's fault: the ``salvage`` scenario.

The scenario's home holds, beside the worker's session, a damaged session ``victim`` in
``<home>/damaged/``, made by ``prepare_damaged`` before the case: four epochs of keyed
groups, then one byte of a record in its sealed epoch-1 log changed, as a failing disk
or a stray editor would. Open refuses it at that line; ``loopd salvage`` keeps the
longest prefix that opens (epoch 0 and epoch 1 up to the group before the damage) and
moves the rest to ``<home>/damaged/quarantine/victim/<time>-salvage/``. A copy of the
damaged files, made at the same time, stays in ``<home>/damaged-original/`` for the
checks (chaos.oracle.salvage_checks).

The ``salvage`` operation runs the real ``salvage_session`` idempotently, as an
operator's rerun does: a victim that opens, with a finished salvage in its quarantine,
is done; anything else is salvaged (an interrupted salvage's plan is finished by it).
"""

from __future__ import annotations

import os
import shutil
from typing import Final

from worker.offline import salvage
from worker.offline.repair import QUARANTINE_DIR
from worker.offline.salvage_plan import PLAN_NAME
from worker.store.baseline import Baseline
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionError
from worker.store.format.records import Assistant, ToolResult, User
from worker.store.loader import load_session
from worker.store.session import Session

SALVAGE: Final = "salvage"
DAMAGED: Final = "damaged"  # the victim's home, in the case's home
ORIGINAL: Final = "damaged-original"  # the damaged files as prepared, for the checks
VICTIM: Final = "victim"
DAMAGED_LOG: Final = "1.jsonl"
DAMAGED_KEY: Final = "v1b"  # the request whose User record is damaged


def damaged_home(home: str) -> str:
    return os.path.join(home, DAMAGED)


def victim_dir(home: str) -> str:
    return session_dir(damaged_home(home), VICTIM)


def quarantine_dir(home: str) -> str:
    return os.path.join(damaged_home(home), QUARANTINE_DIR, VICTIM)


def prepare_damaged(home: str) -> None:
    """Make the damaged victim and the copy of its files (before the case, no faults)."""
    baseline = Baseline(system="salvage victim", memory="", tools=[{"name": "echo"}])
    with Session.create(damaged_home(home), VICTIM, baseline) as session:
        for epoch in range(4):
            for part in ("a", "b", "c"):
                user = User(text=f"text of v{epoch}{part}", key=f"v{epoch}{part}")
                tool = ToolResult(call=session.next_call(), tool="echo", output=user.text, ok=True)
                session.append_many([user, tool, Assistant(text=f"echo: {user.text}")])
            if epoch < 3:
                session.commit_epoch(f"summary {epoch}", baseline)
    path = os.path.join(victim_dir(home), DAMAGED_LOG)
    with open(path, "rb") as f:
        data = f.read()
    needle = f'"text of {DAMAGED_KEY}"'.encode()
    where = data.index(needle) + len(needle) - 2  # the key's last letter, inside the line
    damaged = data[:where] + b"X" + data[where + 1 :]
    with open(path, "r+b") as f:
        f.write(damaged)
        f.flush()
        os.fsync(f.fileno())
    shutil.copytree(victim_dir(home), os.path.join(home, ORIGINAL))


def salvaged(home: str) -> bool:
    """Whether the victim opens and its quarantine holds a finished salvage (its plan)."""
    quarantine = quarantine_dir(home)
    finished = os.path.isdir(quarantine) and any(
        os.path.lexists(os.path.join(quarantine, entry, PLAN_NAME))
        for entry in os.listdir(quarantine)
    )
    if not finished or os.path.lexists(os.path.join(victim_dir(home), PLAN_NAME)):
        return False
    try:
        load_session(victim_dir(home), VICTIM, history=True)
    except SessionError:
        return False
    return True


def salvage_victim(home: str) -> None:
    """``loopd salvage`` of the victim, run again as an operator would: a run before the
    crash that finished it is told by salvage's refusal (nothing to salvage), which it
    gives only once it made that salvage's last steps durable."""
    done = salvaged(home)
    try:
        salvage.salvage_session(damaged_home(home), VICTIM)
    except salvage.SalvageRefused:
        if not done:
            raise
