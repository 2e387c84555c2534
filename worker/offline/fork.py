"""A session forked from another's epoch: ``loopd fork ID NEW --epoch E``.

NEW holds ID's epochs 0..E as they are (sealed logs never change: each is hard-linked,
or copied where the file system cannot link) and an epoch E+1 of its own, started
from E's recorded summary as a resume after the ``EpochEnd`` would start it: the
carried state E's ``EpochEnd`` binds, the baseline the App gives, ``forked_from``
naming ID (docs/format.md, "Forks"), and the App and version that built that baseline,
as a worker's resume would name its own (docs/apps.md, "Versions"). Only sealed epochs
are read, never the newest log a worker may be appending to, so a live ID needs no
coordination: no lock, no point named by its worker.

Crash safety: NEW is built in ``<home>/trash/<NEW>.<time>.forking/`` (each file and
the directory fsynced), checked as ``loopd verify`` checks a session, and renamed into
``sessions/`` in one step; a fork cut short leaves its remains in the trash, never a
part of NEW.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from worker.offline.repair import make_dirs
from worker.offline.trash import TRASH_DIR, stamp
from worker.store.baseline import Baseline
from worker.store.disk import durable
from worker.store.disk.files import open_directory, read_file
from worker.store.disk.layout import SESSIONS_DIR, session_dir
from worker.store.epochs.carried_state import plan_next_epoch
from worker.store.errors import PathError, SessionError, SessionIOError
from worker.store.format.records import EpochEnd, decode_line, encode_lines
from worker.store.key_index import remove_stale, write_segments
from worker.store.loader import baseline_path, list_epochs, load_session, log_path
from worker.store.schedules import carried_schedules
from worker.store.session_id import validate_session_id
from worker.store.session_state import SessionState
from worker.store.session_view import SessionView

# os.link refused for a reason a copy does not have: another file system, one that has
# no hard links, or a file at its link limit.
COPY_INSTEAD: Final = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}
)
STAGING_SUFFIX: Final = ".forking"


class ForkError(PathError):
    """A fork cannot be made; ``path: why``."""


class StagedSession(SessionView):
    """The session being forked as of the end of epoch E, read-only: what the App's
    ``next_baseline`` is given (its ``baseline`` is E's, its ``records`` E's)."""

    def __init__(self, state: SessionState) -> None:
        self._state = state


@dataclass(frozen=True, slots=True, kw_only=True)
class StagedFork:
    """A fork's shared epochs in place in the trash; ``finish_fork`` adds its own epoch."""

    home: str
    source: str
    new: str
    epoch: int  # E: the last shared epoch
    staging: str
    state: SessionState  # as of the end of epoch E, its EpochEnd last
    summary: str  # E's EpochEnd.summary: the new epoch's carry
    linked: int
    copied: int

    @property
    def session(self) -> StagedSession:
        """What the App's ``next_baseline`` is given."""
        return StagedSession(self.state)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkResult:
    directory: str
    source: str
    epoch: int
    linked: int
    copied: int


def sealed_through(home: str | os.PathLike[str], source: str, epoch: int | None) -> int:
    """The epoch to fork from: ``epoch`` if sealed, else (None) the newest sealed one.

    An epoch is sealed once its log ends with ``EpochEnd``; the newest one of a live
    session is open, and refused: its records may still grow.
    """
    directory = session_dir(home, source)
    fd = open_directory(directory)
    try:
        epochs = list_epochs(directory, fd)
        newest = epochs[-1]
        data = read_file(fd, f"{newest}.jsonl", log_path(directory, newest))
    finally:
        os.close(fd)
    newest_sealed = newest if _ends_with_epoch_end(data) else newest - 1
    if epoch is None:
        epoch = newest_sealed
        if epoch < 0:
            raise ForkError(
                directory,
                "has no sealed epoch yet (epoch 0 is open): `loopd compact` it first",
            )
    if epoch < 0 or epoch > newest:
        raise ForkError(directory, f"has no epoch {epoch} (epochs 0..{newest})")
    if epoch > newest_sealed:
        raise ForkError(
            log_path(directory, epoch),
            f"epoch {epoch} is open (no EpochEnd yet): fork from a sealed one "
            f"(0..{newest_sealed}), or `loopd compact` the session first",
        )
    return epoch


def _ends_with_epoch_end(data: bytes) -> bool:
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    try:
        last, _part = decode_line(data[start:-1])
    except ValueError:
        return False  # a line being written: the epoch is open
    return isinstance(last, EpochEnd)


def stage_fork(home: str | os.PathLike[str], source: str, new: str, epoch: int) -> StagedFork:
    """Put ``source``'s epochs 0..``epoch`` (sealed) into a staging directory, with the
    key index rebuilt from their logs, and check their whole history."""
    home = os.fspath(home)
    validate_session_id(source)
    validate_session_id(new)
    if new == source:
        raise ForkError(session_dir(home, new), "a fork needs a new id")
    target = session_dir(home, new)
    if os.path.lexists(target):
        raise ForkError(target, "already exists; fork to a new id")
    origin = session_dir(home, source)
    staging = os.path.join(home, TRASH_DIR, f"{new}.{stamp()}{STAGING_SUFFIX}")
    make_dirs(staging)
    linked = copied = 0
    for number in range(epoch + 1):
        for path in (log_path(origin, number), baseline_path(origin, number)):
            # A sealed epoch's baseline may be missing (open never reads it): E's is needed.
            needed = path.endswith(".jsonl") or number == epoch
            how = _share(path, os.path.join(staging, os.path.basename(path)), needed=needed)
            linked += how == "linked"
            copied += how == "copied"
    durable.fsync_dir(staging)
    try:
        state = load_session(staging, source, history=True, index_files=False)
    except SessionError as exc:
        shutil.rmtree(staging)
        raise ForkError(origin, f"epochs 0..{epoch} do not read as a session: {exc}") from exc
    write_segments(staging, state.key_index.segments)  # E's index, as the logs give it
    closing = state.records[-1]
    assert isinstance(closing, EpochEnd)  # sealed_through chose an epoch that ends so
    return StagedFork(
        home=home,
        source=source,
        new=new,
        epoch=epoch,
        staging=staging,
        state=state,
        summary=closing.summary,
        linked=linked,
        copied=copied,
    )


def _share(source: str, target: str, *, needed: bool) -> str:
    """Hard-link ``source`` as ``target``, or copy it, and fsync it: "linked", "copied",
    or "missing" (only where not ``needed``)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.ENOENT and not needed and not os.path.lexists(source):
            return "missing"
        if exc.errno not in COPY_INSTEAD:
            raise SessionIOError(
                source, exc.errno or errno.EIO, f"cannot link it into the fork: {exc}"
            ) from exc
    else:
        durable.fsync_file(target)  # the shared inode: cheap for a file fsynced when sealed
        return "linked"
    fd = open_directory(os.path.dirname(source))
    try:
        data = read_file(fd, os.path.basename(source), source)
    finally:
        os.close(fd)
    durable.write_file_atomic(target, data, sync_dir=False)
    return "copied"


AppVersion = tuple[str, str]
"""An App (``module:attribute``) and its version (worker.app.version)."""


def finish_fork(
    staged: StagedFork, baseline: Baseline, built_by: AppVersion | None = None
) -> ForkResult:
    """Write the fork's own epoch E+1 (``baseline``, carrying what E's EpochEnd binds,
    ``forked_from``, naming ``built_by``: the App and version that built ``baseline``,
    None for none), check the whole session, and rename it into ``sessions/``."""
    state = staged.state
    closing = state.records[-1]
    assert isinstance(closing, EpochEnd)
    plan = plan_next_epoch(state).matching(closing.carried)
    if plan is None or plan.fence_token is None:
        abandon_fork(staged)
        raise ForkError(
            log_path(staged.staging, staged.epoch),
            "was sealed by a loopd from before the carried fence: fork from a later epoch",
        )
    app, version = built_by or (None, None)  # given, never this process's stamp
    start = replace(
        plan.start(state, baseline.hash()), session=staged.new, forked_from=staged.source,
        app=app, app_version=version,
    )  # fmt: skip
    line, crc = encode_lines((start,), 0)
    carried = carried_schedules(state.records)  # pending at E's end: a resume carries them
    if carried:
        more, _crc = encode_lines(carried, crc)
        line += more
    following = staged.epoch + 1
    write_segments(staged.staging, plan.new_segments)
    durable.write_file_atomic(baseline_path(staged.staging, following), baseline.to_json())
    durable.write_file_atomic(log_path(staged.staging, following), line)
    fd = open_directory(staged.staging)
    try:
        remove_stale(fd, staged.staging, plan.index)
    finally:
        os.close(fd)
    durable.fsync_dir(staged.staging)
    try:  # checked where it is staged: a fork that does not verify is never put in place
        load_session(staged.staging, staged.new, history=True)
    except SessionError as exc:
        abandon_fork(staged)
        raise ForkError(staged.staging, f"the fork does not verify: {exc}") from exc
    target = session_dir(staged.home, staged.new)
    if os.path.lexists(target):
        abandon_fork(staged)
        raise ForkError(target, "was created meanwhile; fork to a new id")
    make_dirs(os.path.dirname(target))
    durable.rename(staged.staging, target)
    durable.fsync_dir(os.path.join(staged.home, SESSIONS_DIR))
    durable.fsync_dir(os.path.dirname(staged.staging))
    return ForkResult(
        directory=target,
        source=staged.source,
        epoch=staged.epoch,
        linked=staged.linked,
        copied=staged.copied,
    )


def abandon_fork(staged: StagedFork) -> None:
    """Remove a fork that will not be finished (its shared files stay the origin's)."""
    shutil.rmtree(staged.staging, ignore_errors=True)


def fork_session(
    home: str | os.PathLike[str],
    source: str,
    new: str,
    epoch: int | None,
    next_baseline: Callable[[SessionView, str], Baseline],
    built_by: AppVersion | None = None,
) -> ForkResult:
    """Fork ``source`` as ``new`` from ``epoch`` (None: its newest sealed one), the new
    epoch's baseline ``next_baseline(session as of E, E's summary)``, built by the App
    and version ``built_by`` (named by its SessionStart)."""
    staged = stage_fork(home, source, new, sealed_through(home, source, epoch))
    try:
        baseline = next_baseline(staged.session, staged.summary)
    except BaseException:
        abandon_fork(staged)
        raise
    return finish_fork(staged, baseline, built_by)
