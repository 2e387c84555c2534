"""Structure-aware fuzzing of open: crafted logs are refused with a SessionError, never
anything else, and reading changes no byte.

The mutations are the ones an attacker or a broken disk produces: duplicate JSON keys,
two records on one line, deep nesting, spaces, a request key used twice, a line
copied, whole lines dropped, bytes zeroed or flipped, and a session file replaced by a
FIFO, a directory or a link.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker import Assistant, Baseline, Session, SessionError, ToolResult, Usage, User
from worker.store.inspection import inspect_session

BASELINE = Baseline(system="s", memory="", tools=[])
T = "2026-11-29T20:17:57.123456Z"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MUTATIONS = (
    "duplicate-key",
    "two-records",
    "deep-nesting",
    "space",
    "repeat-key",
    "copy-line",
    "drop-lines",
    "zero-bytes",
    "flip-byte",
    "fifo",
    "directory",
    "link",
)


def _tree_digest(home: str) -> dict[str, str]:
    """Digest of every regular file under ``home``; the kind of anything else."""
    found = {}
    for directory, dirs, files in os.walk(home):
        for name in files + dirs:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                found[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                found[path] = stat.filemode(mode)
    return found


def _write_session(home: str, requests: int) -> Path:
    with Session.create(home, "f", BASELINE) as session:
        for n in range(requests):
            session.append_many(
                [
                    User(time=T, text=f"u{n}", key=f"k{n}"),
                    ToolResult(time=T, call=session.next_call(), tool="t", output="o", ok=True),
                    Assistant(time=T, text=f"a{n}"),
                    Usage(time=T, prompt_tokens=1, completion_tokens=2, context_tokens=3),
                ]
            )
        if requests % 2:
            session.commit_epoch("summary", BASELINE)
            session.append(User(time=T, text="after", key="late"))
        return Path(session.log_path)


def _mutate(log: Path, kind: str, data: st.DataObject) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    at = data.draw(st.integers(min_value=0, max_value=len(lines) - 1), label="line")
    line = lines[at]
    if kind == "duplicate-key":
        comma = line.index(b",")
        lines[at] = line[: comma + 1] + b'"time":"x",' + line[comma + 1 :]
    elif kind == "two-records":
        following = lines[(at + 1) % len(lines)]
        glue = data.draw(st.sampled_from([b"", b",", b" "]), label="glue")
        lines[at] = line.rstrip(b"\n") + glue + following
    elif kind == "deep-nesting":
        depth = data.draw(st.sampled_from([50, 5_000, 100_000]), label="depth")
        comma = line.index(b",")
        lines[at] = line[: comma + 1] + b'"x":' + b"[" * depth + b"]" * depth + line[comma:]
    elif kind == "space":
        offset = data.draw(st.integers(min_value=1, max_value=len(line) - 1), label="offset")
        lines[at] = line[:offset] + b" " + line[offset:]
    elif kind == "repeat-key":
        lines.append(b'{"type":"User","time":"t","text":"again","untrusted":false,"key":"k0"}\n')
    elif kind == "copy-line":
        lines.insert(data.draw(st.integers(0, len(lines)), label="to"), line)
    elif kind == "drop-lines":
        count = data.draw(st.integers(min_value=1, max_value=3), label="count")
        del lines[at : at + count]
    elif kind == "zero-bytes":
        whole = b"".join(lines)
        start = data.draw(st.integers(0, len(whole) - 1), label="start")
        length = data.draw(st.integers(1, 200), label="length")
        log.write_bytes(whole[:start] + b"\0" * length + whole[start + length :])
        return
    elif kind == "flip-byte":
        offset = data.draw(st.integers(0, len(line) - 1), label="offset")
        lines[at] = line[:offset] + bytes([line[offset] ^ 0x20]) + line[offset + 1 :]
    else:
        name = data.draw(st.sampled_from([log.name, log.name.replace(".jsonl", ".baseline.json")]))
        target = log.parent / name
        target.unlink()
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "directory":
            target.mkdir()
        else:
            target.symlink_to(data.draw(st.sampled_from(["/dev/zero", "/etc/hostname"])))
        return
    log.write_bytes(b"".join(lines))


@pytest.mark.timeout(300)
@SETTINGS
@given(
    kind=st.sampled_from(MUTATIONS),
    requests=st.integers(min_value=1, max_value=40),
    data=st.data(),
)
def test_a_crafted_log_is_refused_with_a_session_error_and_reading_changes_nothing(
    kind: str, requests: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as home:
        log = _write_session(home, requests)
        _mutate(log, kind, data)
        before = _tree_digest(home)
        for read in (lambda: Session.open(home, "f").close(), lambda: inspect_session(home, "f")):
            try:
                read()
            except SessionError as exc:
                text = str(exc)
                assert len(text) < 2000
                assert str(log.parent) in text or "invalid session id" in text
        assert _tree_digest(home) == before
