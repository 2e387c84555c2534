"""Reading a sealed epoch's log: it must be what the next epoch's SessionStart recorded.

Open checks the previous log this way (it reads it anyway, for its ``EpochEnd``);
``verify`` and ``inspect --all`` check every sealed log; the reader of a sealed epoch's
records (a duplicate's answer, a page of records) checks the one it serves. A sealed
log whose length or CRC-32 is not the recorded one is refused at its line
(``worker.store.format.line_checksums``), never served.
"""

from __future__ import annotations

import os

from worker.store.disk.files import Directory, open_directory, read_file
from worker.store.epochs.carried_checks import EpochEndAt
from worker.store.epochs.epoch_log import DecodedLog, check_epoch, decode_log, session_of_sealed
from worker.store.errors import InvalidLog
from worker.store.format.line_checksums import refuse_sealed, sealed_binding, sealed_intact
from worker.store.format.records import EpochEnd, SessionStart, decode_line
from worker.store.session_state import log_path


def first_start(dir_fd: Directory, directory: str, epoch: int) -> SessionStart | None:
    """The first record of ``epoch``'s log if it is a SessionStart (read alone), else None.

    Whatever else is wrong with that log is refused when it is read itself.
    """
    path = log_path(directory, epoch)
    data = read_file(dir_fd, os.path.basename(path), path)
    try:
        first, _part = decode_line(data[: data.find(b"\n")])
    except ValueError:
        return None
    return first if isinstance(first, SessionStart) else None


def check_sealed(path: str, data: bytes, epoch: int, following: SessionStart | None) -> None:
    """Sealed log ``epoch`` must be the length and CRC-32 ``following`` (the next
    epoch's SessionStart) recorded, if it recorded them.

    A mismatch is named at its line: the first line whose own checksum fails, or, when
    every line checks, where lines were cut off (or added to) its end.
    """
    binding = sealed_binding(following) if following is not None else None
    if sealed_intact(data, binding):
        return
    assert binding is not None
    decode_log(path, data)  # the first line whose checksum fails, if one does
    refuse_sealed(path, data, binding, epoch + 1)


def read_sealed(directory: str, epoch: int, files: Directory | None = None) -> DecodedLog:
    """Read and decode sealed log ``epoch``, checked against the next epoch's SessionStart.

    Its structure is checked too (a sealed epoch ends with its EpochEnd): a sealed log
    whose next SessionStart recorded no length (written before checksums) and that was
    cut at a line boundary is refused at its last line. ``files``: where an open
    session's files are read (``Session.files``: a database's, not a directory's);
    None opens ``directory``.
    """
    path = log_path(directory, epoch)
    dir_fd = open_directory(directory) if files is None else files
    try:
        data = read_file(dir_fd, os.path.basename(path), path)
        following = first_start(dir_fd, directory, epoch + 1)
        check_sealed(path, data, epoch, following)
    finally:
        if files is None:
            assert isinstance(dir_fd, int)
            os.close(dir_fd)
    decoded = decode_log(path, data)
    session_id = session_of_sealed(following, os.path.basename(directory))
    check_epoch(path, session_id, epoch, decoded.records, newest=False)
    return decoded


def previous_end(dir_fd: Directory, directory: str, epoch: int, first: SessionStart) -> EpochEndAt:
    """Read the previous log's last line: it must be the EpochEnd leading to ``epoch``.

    The whole previous log must also be the length and CRC-32 ``first`` (``epoch``'s
    SessionStart) recorded.
    """
    path = log_path(directory, epoch - 1)
    data = read_file(dir_fd, os.path.basename(path), path)
    check_sealed(path, data, epoch - 1, first)
    lines = data.count(b"\n")
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    try:
        last, _part = decode_line(data[start:-1]) if data.endswith(b"\n") else (None, None)
    except ValueError as exc:
        raise InvalidLog(path, lines, f"undecodable last record: {exc}") from exc
    if not isinstance(last, EpochEnd) or last.next != epoch:
        raise InvalidLog(
            path,
            max(lines, 1),
            f"epoch {epoch - 1} does not end with EpochEnd (the one leading to epoch {epoch})",
        )
    return EpochEndAt(path, lines, last)
