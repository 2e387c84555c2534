"""A copy changing roles: a follower promoted to owner, a returning old owner demoted.

``promote``: an in-sync follower that took the session over in etcd moves its copy
from ``<home>/replicas/sessions/<id>`` to ``<home>/sessions/<id>`` (it opens and
verifies as it is: no repair); its worker then writes ``Owner{node, T'}``.

``demote``: an old owner that finds another node owns the session keeps the prefix
of its log that the new owner's log also begins with (``shared_prefix``, found by the
new owner from the old one's line ends, ``line_ends``) and moves everything after it
to ``<home>/quarantine/<id>/`` (never deleted: it was never acknowledged, since every
acknowledged write is on every in-sync follower, the new owner included); the copy,
now a prefix of the new owner's log, becomes a follower's and catches up from there.
A returning old owner does not know that prefix yet (the new owner's log is on another
host): it demotes its copy whole (``keep`` None, a torn last group quarantined as at
any open of a copy), and the new owner's catch-up finds the shared prefix from the
copy's line ends and cuts the rest to ``<home>/replicas/quarantine/<id>/``
(``rewind``), so it is caught up from its last shared line, never from nothing.
"""

from __future__ import annotations

import os
import zlib
from datetime import UTC, datetime

from worker.store import durable
from worker.store.creation import sync_parents
from worker.store.epoch_files import list_epochs
from worker.store.errors import SessionExists
from worker.store.files import open_directory, read_file
from worker.store.index_repair import key_index_damaged, rebuild_key_index
from worker.store.layout import ensure_sessions_dir, lock_existing, session_dir
from worker.store.loader import load_session
from worker.store.lock import unlock_directory
from worker.store.repair import QUARANTINE_DIR, make_dirs
from worker.store.replica import Replica
from worker.store.replica_fences import fence_path
from worker.store.replica_types import Position, ReplicaRefused
from worker.store.session_state import baseline_path, log_path

REPLICAS_DIR = "replicas"


def replicas_root(home: str | os.PathLike[str]) -> str:
    """``<home>/replicas``: the home of a node's follower copies."""
    return os.path.join(os.fspath(home), REPLICAS_DIR)


def promote(home: str | os.PathLike[str], session_id: str) -> str:
    """Make the follower's copy of ``session_id`` this node's session; its directory.

    The copy is opened first (a torn last group goes to quarantine, as at any open of
    a copy), then renamed into ``sessions/`` and both parents fsynced.
    """
    home = os.fspath(home)
    root = replicas_root(home)
    Replica.open(root, session_id).close()
    source, target = session_dir(root, session_id), session_dir(home, session_id)
    if os.path.lexists(target):
        raise SessionExists(target)
    ensure_sessions_dir(os.path.dirname(target))
    durable.rename(source, target)
    sync_parents(target)
    durable.fsync_dir(os.path.dirname(source))
    fence = fence_path(root, session_id)
    if os.path.exists(fence):
        os.unlink(fence)
    return target


def line_ends(
    home: str | os.PathLike[str], session_id: str, epoch: int | None = None
) -> tuple[int, list[list[int]]]:
    """An epoch (the newest by default) and ``[size, crc]`` of each line end of its log.

    The old owner sends them, newest epoch first and older ones while none matches, to
    the new owner, whose ``shared_prefix`` answers the longest it shares.
    """
    directory = session_dir(home, session_id)
    dir_fd = open_directory(directory)
    try:
        epoch = list_epochs(directory, dir_fd)[-1] if epoch is None else epoch
        path = log_path(directory, epoch)
        data = read_file(dir_fd, os.path.basename(path), path)
    finally:
        os.close(dir_fd)
    ends, crc, start = [], 0, 0
    while (end := data.find(b"\n", start) + 1) > 0:
        crc = zlib.crc32(memoryview(data)[start:end], crc)
        ends.append([end, crc])
        start = end
    return epoch, ends


def shared_prefix(
    home: str | os.PathLike[str], session_id: str, epoch: int, ends: list[list[int]]
) -> Position | None:
    """The longest of ``ends`` (another copy's line ends in ``epoch``) that this copy's log
    of that epoch begins with; None if it holds no such epoch or not even its first line."""
    directory = session_dir(home, session_id)
    path = log_path(directory, epoch)
    try:
        with open(path, "rb") as log:
            data = log.read()
    except FileNotFoundError:
        return None
    best = None
    for size, crc in ends:
        if size > len(data) or zlib.crc32(memoryview(data)[:size]) != crc:
            break
        best = Position(epoch, size, crc)
    return best


def demote(
    home: str | os.PathLike[str], session_id: str, keep: Position | None = None
) -> list[str]:
    """Keep only ``keep`` of this node's session and make it a follower's copy.

    Everything after ``keep`` (the rest of that epoch's log, and any later epoch's
    files) is moved to ``<home>/quarantine/<id>/`` first; the files written there are
    returned. ReplicaRefused if the log does not begin with ``keep`` (nothing changes).
    ``keep`` None keeps the whole copy (a torn last group quarantined first): the new
    owner cuts what it does not share when it catches the copy up. SessionExists if
    this node holds a follower's copy of the session already (nothing changes).
    """
    home = os.fspath(home)
    directory = session_dir(home, session_id)
    root = replicas_root(home)
    target = session_dir(root, session_id)
    if os.path.lexists(target):
        raise SessionExists(target)
    if keep is None:
        opened = Replica.open(home, session_id)  # verified, a torn tail quarantined
        moved = [] if opened.repaired is None else [opened.repaired.quarantine]
        opened.close()
    else:
        lock_fd = lock_existing(directory)
        try:
            moved = _cut(home, directory, session_id, lock_fd, keep)
        finally:
            unlock_directory(lock_fd)
        if key_index_damaged(home, session_id) is not None:
            rebuild_key_index(home, session_id)  # a later commit had merged the index files
        load_session(directory, session_id)  # it must open as it is now
    ensure_sessions_dir(os.path.dirname(target))
    durable.rename(directory, target)
    sync_parents(target)
    durable.fsync_dir(os.path.dirname(directory))
    return moved


def rewind(root: str | os.PathLike[str], session_id: str, keep: Position) -> list[str]:
    """Cut a follower's copy (in the replicas home ``root``) back to ``keep``, the longest
    prefix it shares with the new owner's log: what follows goes to
    ``<root>/quarantine/<id>/`` (never deleted); the files written there are returned.

    The copy's suffix was never acknowledged (an acknowledged write is on every in-sync
    follower, the new owner included); the copy must not be open (its lock is taken).
    """
    root = os.fspath(root)
    directory = session_dir(root, session_id)
    lock_fd = lock_existing(directory)
    try:
        moved = _cut(root, directory, session_id, lock_fd, keep)
    finally:
        unlock_directory(lock_fd)
    if key_index_damaged(root, session_id) is not None:
        rebuild_key_index(root, session_id)
    load_session(directory, session_id)  # it must open as it is now
    return moved


def _cut(home: str, directory: str, session_id: str, lock_fd: int, keep: Position) -> list[str]:
    epochs = list_epochs(directory, lock_fd)
    path = log_path(directory, keep.epoch)
    if keep.epoch not in epochs:
        raise ReplicaRefused(directory, f"no epoch {keep.epoch} here to keep ({keep})")
    data = read_file(lock_fd, os.path.basename(path), path)
    if (
        keep.size > len(data)
        or data[keep.size - 1 : keep.size] != b"\n"
        or zlib.crc32(memoryview(data)[: keep.size]) != keep.crc
    ):
        raise ReplicaRefused(path, f"the log does not begin with {keep}: not a suffix to cut")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target_dir = os.path.join(home, QUARANTINE_DIR, session_id)
    make_dirs(target_dir)
    moved = []
    for epoch in reversed(epochs[epochs.index(keep.epoch) + 1 :]):
        for source in (log_path(directory, epoch), baseline_path(directory, epoch)):
            if os.path.exists(source):
                target = os.path.join(target_dir, f"{stamp}-{os.path.basename(source)}")
                name = os.path.basename(source)
                durable.write_file_atomic(target, read_file(lock_fd, name, source))
                moved.append(target)
                os.unlink(source)
        durable.fsync_dir(directory)
    if keep.size < len(data):
        target = os.path.join(target_dir, f"{stamp}-{keep.epoch}.jsonl.unacknowledged")
        durable.write_file_atomic(target, data[keep.size :])
        moved.append(target)
        fd = durable.open_append(path)
        try:
            durable.truncate(fd, keep.size, path)
        finally:
            durable.close(fd)
    return moved
