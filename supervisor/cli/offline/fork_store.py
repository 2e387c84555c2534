"""``loopd fork ID NEW --store URI``: the fork of a session kept in PostgreSQL, into it.

The database cannot link files, so NEW's epochs 0..E are copies of ID's. They are taken
from one snapshot of ID's files (``session_files``), put into a temporary home, and
forked there by the store's own fork (worker.offline.fork: sealed epochs only, the key
index rebuilt, the whole history checked, epoch E+1 from E's recorded summary with the
baseline the App gives, naming that App and its version); NEW's files are then
created in the database in one transaction (``put_session``: all of NEW or nothing) and
read back as ``verify`` reads them. ID is read, never claimed: its worker serves on.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from worker.offline.fork import (
    AppVersion,
    StagedFork,
    abandon_fork,
    finish_fork,
    sealed_through,
    stage_fork,
)
from worker.store.baseline import Baseline
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionExists
from worker.store.postgres import PostgresStore
from worker.store.postgres.transfer import put_session, read_session, session_files


@dataclass(frozen=True)
class StoredFork:
    source: str
    new: str
    epoch: int
    files: int
    place: str


def fork_in_store(
    uri: str,
    source: str,
    new: str,
    epoch: int | None,
    baseline_for: Callable[[StagedFork], tuple[Baseline, AppVersion | None]],
) -> StoredFork:
    """Fork ``source`` as ``new`` inside the store at ``uri`` (SessionError if it cannot)."""
    store = PostgresStore(uri)
    if new in store.session_ids():
        raise SessionExists(store.session_dir(new))
    files = session_files(store, source)
    with tempfile.TemporaryDirectory(prefix="loopd-fork-") as home:
        origin = session_dir(home, source)
        os.makedirs(origin, mode=0o700)
        for name, data in files.items():
            with open(os.path.join(origin, name), "xb") as out:
                out.write(data)
        staged = stage_fork(home, source, new, sealed_through(home, source, epoch))
        try:
            baseline, built_by = baseline_for(staged)
        except BaseException:
            abandon_fork(staged)
            raise
        result = finish_fork(staged, baseline, built_by)
        target = session_dir(home, new)
        made = {}
        for name in sorted(os.listdir(target)):
            with open(os.path.join(target, name), "rb") as f:
                made[name] = f.read()
    put_session(store, new, made)
    read_session(store, new, history=True, canonical=True)
    return StoredFork(source=source, new=new, epoch=result.epoch, files=len(made),
                      place=store.place)  # fmt: skip
