"""The "damage" fault: a sealed epoch's log changed on disk, outside any crash.

At boundary k the hook, inside the live worker, damages the newest sealed log as bit
rot or a stray edit would, with plain ``os`` calls (no boundary of the store's):
``flip`` changes the case of one letter of a record's text (the JSON stays valid, the
length too), ``cut`` truncates the log at
a line boundary (its last line, the EpochEnd, gone). The worker goes on. What was
damaged is written to ``damage.json`` beside the home, for the check
(``chaos.run.damage_case``): the damage must always be refused with its ``path:line``,
never served.
"""

from __future__ import annotations

import json
import os
import re
from typing import Final

DAMAGE_VARIANTS: Final = ("flip", "cut")
RECORD_NAME: Final = "damage.json"
_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
# A letter in the text of a record (never its type, time or key): the line still
# decodes to a valid record, which only its checksum can tell from the one written.
_LETTER_IN_STRING: Final = re.compile(rb'"(?:text|summary|output)":"[^"\\]*?([A-Za-z])')


def damage_record_path(home: str) -> str:
    """Where the description of a case's damage is written: beside the home."""
    return os.path.join(os.path.dirname(os.path.abspath(home)), RECORD_NAME)


def damage_sealed(step_path: str, variant: str) -> dict[str, object] | None:
    """Damage the newest sealed log of the session ``step_path`` (a boundary's path) is in.

    Returns (and records) what was done; None (and ``{"damaged": null}`` recorded) when
    no epoch is sealed yet.
    """
    parts = os.path.abspath(step_path).split(os.sep)
    if "sessions" not in parts:  # a step on the home itself
        parts.append("sessions")
    at = len(parts) - 1 - parts[::-1].index("sessions")
    home = os.sep.join(parts[:at])
    session_dir = os.sep.join(parts[: at + 2])
    names = os.listdir(session_dir) if len(parts) > at + 1 and os.path.isdir(session_dir) else []
    epochs = sorted(int(n[:-6]) for n in names if _LOG.fullmatch(n))
    done: dict[str, object] | None = None
    if len(epochs) > 1:
        path = os.path.join(session_dir, f"{epochs[-2]}.jsonl")
        with open(path, "rb") as f:
            data = f.read()
        changed, line = _flip(data) if variant == "flip" else _cut(data)
        if changed is not None:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, changed)
                os.fsync(fd)
            finally:
                os.close(fd)
            # A cut is named at the first line cut (by the length the next SessionStart
            # recorded) or, when it recorded none (written before checksums), at the
            # last line left (an older epoch without its EpochEnd).
            newest = os.path.join(session_dir, f"{epochs[-1]}.jsonl")
            with open(newest, "rb") as f:
                bound = b'"prior_log_size"' in f.readline()
            lines = [line - 1] if variant == "cut" and not bound else [line]
            done = {"path": path, "line": line, "lines": lines, "variant": variant,
                    "epoch": epochs[-2]}  # fmt: skip
    with open(damage_record_path(home), "w", encoding="utf-8") as f:
        json.dump({"damaged": done}, f)
    return done


def _flip(data: bytes) -> tuple[bytes | None, int]:
    """One letter of a record's text, in the line nearest the middle, changes case."""
    lines = data.split(b"\n")[:-1]
    order = sorted(range(len(lines)), key=lambda i: abs(i - len(lines) // 2))
    for index in order:
        found = _LETTER_IN_STRING.search(lines[index])
        if found is None:
            continue
        start = sum(len(line) + 1 for line in lines[:index]) + found.start(1)
        flipped = bytes([data[start] ^ 0x20])
        return data[:start] + flipped + data[start + 1 :], index + 1
    return None, 0


def _cut(data: bytes) -> tuple[bytes | None, int]:
    """The log without its last line (a cut at a line boundary); the line cut first."""
    lines = data.split(b"\n")[:-1]
    if len(lines) < 2:
        return None, 0
    return data[: data.rstrip(b"\n").rfind(b"\n") + 1], len(lines)
