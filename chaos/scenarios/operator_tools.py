"""The operator's tools as a client of the rig runs them: backup, restore, a key index rebuilt.

The ``operator-tools`` scenario (chaos.scenarios.scenarios) builds a session of several epochs
and then does what docs/operations.md tells an operator to do, each step with the
real tool, each cut short by the case's fault at any of its durable steps:

- ``backup``: ``loopd backup`` of the live session (its point named by the session, as
  its worker names it) into ``<home>/backups/``;
- ``restore``: the backup put back into a scratch home, ``<home>/restored/`` (the
  documented test restore);
- ``lose-index``: a key index file of the restored copy goes missing (moved to
  ``<home>/lost-index/``, as a stray script would), so that open refuses it;
- ``rebuild-index``: ``loopd repair``'s rebuild of the key index from the logs.

None of these has a request key, so every run of the scenario does each again; each is
idempotent the way an operator's rerun is: a backup directory that checks is kept, one
cut short (or refused) is moved aside first, as ``backup`` says to; a restored copy
that holds the backup is kept, anything else is replaced (``restore --force``); the
index is rebuilt whatever is there. The checks are in chaos.oracle.tool_checks.
"""

from __future__ import annotations

import os
from typing import Final

from chaos.scenarios.salvage_tool import SALVAGE, salvage_victim
from worker.offline import restore
from worker.offline.backup import PARTIAL, BackupError, Point, backup_session, finish_backup
from worker.offline.index_repair import rebuild_key_index
from worker.offline.repair import make_dirs
from worker.store.disk import durable  # restore's functions through it: mutants patch them
from worker.store.disk.layout import session_dir
from worker.store.session import Session

BACKUP: Final = "backup"
RESTORE: Final = "restore"
LOSE_INDEX: Final = "lose-index"
REBUILD_INDEX: Final = "rebuild-index"
TOOL_KINDS: Final = frozenset({BACKUP, RESTORE, LOSE_INDEX, REBUILD_INDEX, SALVAGE})

BACKUPS: Final = "backups"  # the backup's DEST, in the home
ASIDE: Final = "aside"  # in DEST: backups cut short or refused, moved aside for a new one
RESTORED: Final = "restored"  # the scratch home of the test restore
LOST: Final = "lost-index"  # where the lost key index file went
LOST_FILE: Final = "0-1.keys"  # the index file of epochs 0 and 1, lost and rebuilt


def backup_dir(home: str, session_id: str) -> str:
    return os.path.join(home, BACKUPS, session_id)


def restored_home(home: str) -> str:
    return os.path.join(home, RESTORED)


def store_files(directory: str) -> dict[str, bytes]:
    """The logs and baselines in ``directory`` by name (what a restore must reproduce)."""
    found = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith((".jsonl", ".baseline.json")) and name.split(".", 1)[0].isdigit():
            with open(os.path.join(directory, name), "rb") as f:
                found[name] = f.read()
    return found


def apply_tool_op(session: Session, home: str, kind: str, session_id: str) -> Session:
    """Run the operator's tool ``kind`` (idempotently, as a rerun does); return the session."""
    if kind == BACKUP:
        _backup(session, home, session_id)
    elif kind == RESTORE:
        _restore(home, session_id)
    elif kind == LOSE_INDEX:
        _lose_index(home, session_id)
    elif kind == REBUILD_INDEX:
        rebuild_key_index(restored_home(home), session_id)
    elif kind == SALVAGE:
        salvage_victim(home)  # the damaged session beside it (chaos.scenarios.salvage_tool)
    else:
        raise ValueError(f"unknown tool {kind!r}")
    return session


def _backup(session: Session, home: str, session_id: str) -> None:
    target = backup_dir(home, session_id)
    if os.path.lexists(target):
        try:
            restore.check_backup(target)
        except BackupError:
            _move_aside(target)  # not one to count on: take a new one
        else:
            # Taken before the crash and whole, its rename perhaps not yet durable: the
            # tool's rerun finishes it, as `loopd backup` run again does before it refuses.
            finish_backup(target)
            return
    if os.path.lexists(target + PARTIAL):
        _move_aside(target + PARTIAL)  # "left from a backup cut short; move it aside first"
    # The point a live worker names: between batches its log's length is a group
    # boundary and all of it is durable (worker.loop.replies.durable_point).
    point = Point(session.epoch, os.stat(session.log_path).st_size, "worker")
    backup_session(home, session_id, os.path.dirname(target), point)


def _move_aside(path: str) -> None:
    aside = os.path.join(os.path.dirname(path), ASIDE)
    make_dirs(aside)
    taken = len(os.listdir(aside))
    durable.rename(path, os.path.join(aside, f"{os.path.basename(path)}.{taken}"))
    durable.fsync_dir(aside)
    durable.fsync_dir(os.path.dirname(path))


def _restore(home: str, session_id: str) -> None:
    source = backup_dir(home, session_id)
    scratch = restored_home(home)
    directory = session_dir(scratch, session_id)
    there = os.path.lexists(directory)
    if there and store_files(directory) == store_files(source):
        # Restored before the crash, its rename perhaps not yet durable: the tool's rerun
        # finishes it, as `loopd restore` run again does before it says the session exists.
        restore.finish_restore(scratch, session_id)
        return
    restore.restore_session(scratch, source, session_id, replace=there)


def _lose_index(home: str, session_id: str) -> None:
    lost = os.path.join(home, LOST)
    if os.path.lexists(os.path.join(lost, LOST_FILE)):
        return  # lost before the crash (and maybe rebuilt since)
    make_dirs(lost)
    directory = session_dir(restored_home(home), session_id)
    durable.rename(os.path.join(directory, LOST_FILE), os.path.join(lost, LOST_FILE))
    durable.fsync_dir(lost)
    durable.fsync_dir(directory)
