"""The owner's side of shipping: the steps of its log that follow a copy's position.

Read from the owner's session directory without its lock (the owner's worker holds
it and only appends): what a follower needs to catch up from where its copy ends,
and, after each of the owner's own commits, the step that commit wrote. A follower
states its position (epoch, length, CRC-32 of its newest log); the owner checks that
its own log of that epoch has those bytes first (``NotContinuing`` in one line if the
copy diverged or is ahead) and sends every whole group after them, then each later
epoch's first files and lines. A group still being written (the log's tail not yet a
whole group) is left for the next call.
"""

from __future__ import annotations

import os
import re
import zlib
from typing import Final

from worker.store.epoch_files import list_epochs
from worker.store.files import open_directory, read_file
from worker.store.layout import session_dir
from worker.store.replica_types import NotContinuing, Position, Step
from worker.store.session_state import baseline_path, log_path

_CHUNK: Final = 1 << 20  # bytes read at a time when a whole log is checked
_FRAME: Final = re.compile(rb',"part":([0-9]+),"parts":([0-9]+),"crc":"[0-9a-f]{8}"\}$')


def steps_after(
    home: str | os.PathLike[str], session_id: str, position: Position | None, token: int
) -> list[Step]:
    """Every step of the session after ``position`` (None: a copy that does not exist yet).

    ``token`` is the owner's fencing token, carried by each step.
    """
    directory = session_dir(home, session_id)
    dir_fd = open_directory(directory)
    try:
        epochs = list_epochs(directory, dir_fd)
        steps: list[Step] = []
        if position is None:
            first = 0
        else:
            first = position.epoch + 1
            data = _log(dir_fd, directory, position.epoch, epochs, position)
            _check_prefix(directory, position, data)
            steps += _lines(session_id, position.epoch, data, position.size, token)
        for epoch in range(first, epochs[-1] + 1):
            data = _log(dir_fd, directory, epoch, epochs, position)
            start = data.find(b"\n") + 1
            if start == 0:
                break  # the epoch's first line is not there yet
            base = baseline_path(directory, epoch)
            baseline = read_file(dir_fd, os.path.basename(base), base)
            steps.append(Step(session_id, epoch, 0, 0, data[:start], token, baseline))
            steps += _lines(session_id, epoch, data, start, token)
        return steps
    finally:
        os.close(dir_fd)


def _log(dir_fd: int, directory: str, epoch: int, epochs: list[int], at: Position | None) -> bytes:
    if epoch not in epochs:
        assert at is not None  # epochs from 0 up exist
        raise NotContinuing(
            directory,
            f"the copy is at {at}, but this session's newest epoch is {epochs[-1]}: "
            "the copy is ahead of the owner",
        )
    path = log_path(directory, epoch)
    return read_file(dir_fd, os.path.basename(path), path)


def _check_prefix(directory: str, position: Position, data: bytes) -> None:
    """The owner's log of the copy's epoch must begin with the copy's bytes, at a line end."""
    size = position.size
    if size > len(data) or size == 0 or data[size - 1 : size] != b"\n":
        raise NotContinuing(
            directory,
            f"the copy is at {position}, but this log of epoch {position.epoch} is "
            f"{len(data)} bytes with no line ending there: the copy diverged",
        )
    crc = zlib.crc32(memoryview(data)[:size])
    if crc != position.crc:
        raise NotContinuing(
            directory,
            f"the copy is at {position}, but this log's first {size} bytes have CRC-32 "
            f"{crc:08x}: the copy diverged",
        )


def _lines(session_id: str, epoch: int, data: bytes, offset: int, token: int) -> list[Step]:
    """The whole groups of ``data`` after ``offset`` as one append step (none if empty)."""
    end = whole_groups_end(data, offset)
    if end <= offset:
        return []
    prior = zlib.crc32(memoryview(data)[:offset])
    return [Step(session_id, epoch, offset, prior, data[offset:end], token)]


def whole_groups_end(data: bytes, offset: int) -> int:
    """The end of the last whole group of ``data`` after ``offset`` (``offset`` if none).

    A last line without its newline, or the parts 1..i < n of a group, are what a
    write in progress (or torn) leaves: they are not shipped.
    """
    end = data.rfind(b"\n") + 1
    if end <= offset:
        return offset
    start = data.rfind(b"\n", 0, end - 1) + 1
    frame = _FRAME.search(data, start, end - 1)
    if frame is None or frame.group(1) == frame.group(2):
        return end  # a record alone, or the last part of a group
    cut = end
    for _ in range(int(frame.group(1))):  # back to the start of the group's part 1
        cut = data.rfind(b"\n", 0, cut - 1) + 1
    return max(cut, offset)


def split_step(step: Step, max_bytes: int) -> list[Step]:
    """An append step cut at group ends into steps of at most ``max_bytes`` (or one group).

    Each piece continues the one before (its offset and prior CRC-32 follow), so a
    follower applies them in order; an epoch step is returned whole.
    """
    if step.is_epoch or len(step.data) <= max_bytes:
        return [step]
    pieces: list[Step] = []
    data = step.data
    begin = cut = at = 0
    offset, crc = step.offset, step.prior_crc
    while at < len(data):
        end = data.index(b"\n", at) + 1
        frame = _FRAME.search(data, at, end - 1)
        at = end
        if frame is not None and frame.group(1) != frame.group(2):
            continue  # inside a group: never cut here
        if end - begin > max_bytes and cut > begin:
            piece = data[begin:cut]
            pieces.append(Step(step.session, step.epoch, offset, crc, piece, step.token))
            offset, crc, begin = offset + len(piece), zlib.crc32(piece, crc), cut
        cut = end
    piece = data[begin:]
    pieces.append(Step(step.session, step.epoch, offset, crc, piece, step.token))
    return pieces


def tail_step(
    home: str | os.PathLike[str], session_id: str, at: Position, newest: Position, token: int
) -> list[Step]:
    """The steps from ``at`` to ``newest``, both the owner's own positions (its log after
    two of its commits): within one epoch only the new bytes are read, and ``at.crc`` is
    trusted (the owner's own); across an epoch commit, ``steps_after``."""
    if at.epoch != newest.epoch:
        return steps_after(home, session_id, at, token)
    if newest.size <= at.size:
        return []
    path = log_path(session_dir(home, session_id), at.epoch)
    with open(path, "rb") as log:
        log.seek(at.size)
        data = log.read(newest.size - at.size)
    return [Step(session_id, at.epoch, at.size, at.crc, data, token)]


def verify_prefix(home: str | os.PathLike[str], session_id: str, position: Position) -> None:
    """The owner's log of ``position``'s epoch begins with the copy's bytes, at a line end
    (``NotContinuing`` in one line if not); read in chunks: memory stays bounded."""
    directory = session_dir(home, session_id)
    dir_fd = open_directory(directory)
    try:
        epochs = list_epochs(directory, dir_fd)
    finally:
        os.close(dir_fd)
    if position.epoch not in epochs:
        raise NotContinuing(directory, f"the copy is at {position}, but this session's newest "
                            f"epoch is {epochs[-1]}: the copy is ahead of the owner")  # fmt: skip
    crc, left, last = 0, position.size, b""
    with open(log_path(directory, position.epoch), "rb") as log:
        while left > 0 and (chunk := log.read(min(left, _CHUNK))):
            crc, left, last = zlib.crc32(chunk, crc), left - len(chunk), chunk[-1:]
    at = f"the copy is at {position}, but this log"
    if left or position.size == 0 or last != b"\n":
        why = f"{at} of epoch {position.epoch} has no line ending there: the copy diverged"
        raise NotContinuing(directory, why)
    if crc != position.crc:
        why = f"{at}'s first {position.size} bytes have CRC-32 {crc:08x}: the copy diverged"
        raise NotContinuing(directory, why)


def next_step(
    home: str | os.PathLike[str],
    session_id: str,
    at: Position | None,
    token: int,
    max_bytes: int,
) -> Step | None:
    """The step that follows a copy at ``at`` (None: no copy yet), reading only that: the
    whole groups after it in its epoch's log (about ``max_bytes``, at least one group), or
    once that log holds no more, the next epoch's first files; None if there is nothing
    whole to send yet. ``at`` must continue this log (``verify_prefix``)."""
    directory = session_dir(home, session_id)
    if at is None:
        return _epoch_step(directory, session_id, 0, token)
    # The next epoch's log first: once it exists this one is whole (its EpochEnd was
    # made durable before the next epoch's files), so its size is read after.
    sealed = os.path.exists(log_path(directory, at.epoch + 1))
    with open(log_path(directory, at.epoch), "rb") as log:
        size = os.fstat(log.fileno()).st_size
        want = max_bytes
        while at.size < size:
            log.seek(at.size)
            data = log.read(min(want, size - at.size))
            end = whole_groups_end(data, 0)
            if end > 0:
                return Step(session_id, at.epoch, at.size, at.crc, data[:end], token)
            if at.size + len(data) >= size:
                return None  # a group still being written: the next call sends it
            want *= 2  # one group larger than max_bytes
    return _epoch_step(directory, session_id, at.epoch + 1, token) if sealed else None


def _epoch_step(directory: str, session_id: str, epoch: int, token: int) -> Step | None:
    """An epoch's first step (its first line and baseline), None while not written."""
    try:
        with open(log_path(directory, epoch), "rb") as log:
            first = log.readline(_CHUNK)
    except FileNotFoundError:
        return None
    if not first.endswith(b"\n"):
        return None
    base = baseline_path(directory, epoch)
    with open(base, "rb") as file:
        baseline = file.read()
    return Step(session_id, epoch, 0, 0, first, token, baseline)
