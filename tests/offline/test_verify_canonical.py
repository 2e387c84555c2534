"""``verify`` checks every line's canonical form, not only its checksum (issue #29, item 7).

A line whose chained CRC-32 is right but whose bytes are not what the writer writes
for its record (a duplicate key, a space, an escape the writer never makes) is a
forgery or a foreign tool's write: ``loopd verify`` and ``inspect --all`` refuse it at
``path:line``, in a sealed epoch or the newest. ``open`` (and plain ``inspect``, which
reads what open reads) trusts the checksum for speed: docs/format.md, "What each
reader checks".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.forge import reseal
from tests.harness.support import loopd
from worker import Assistant, Session, User
from worker.app import DefaultApp

T = "2026-11-29T20:17:57.123456Z"

Respell = Callable[[bytes], bytes]
FORGERIES: dict[str, tuple[Respell, str]] = {
    # Each decodes to the very record the writer wrote: only the bytes differ.
    "duplicate-key": (lambda t: b'"text":"forged","text":"%s"' % t, "duplicate key 'text'"),
    "space": (lambda t: b'"text": "%s"' % t, "not the canonical encoding"),
    "escape": (lambda t: b'"text":"%s\\u00%x"' % (t[:-1], t[-1]), "not the canonical encoding"),
}


def _session(home: Path) -> Path:
    """Session s of two epochs (0 sealed, 1 the newest) of ten keyed requests each."""
    with Session.create(home, "s", DefaultApp().initial_baseline("s")) as session:
        for epoch in range(2):
            for n in range(10):
                topic = f"topic {epoch * 10 + n}"
                session.append_many(
                    [User(time=T, text=topic, key=f"k{epoch}-{n}"), Assistant(time=T, text="ok")]
                )
            if epoch == 0:
                session.commit_epoch("summary 0", session.baseline)
        return Path(session.dir)


def _forge(directory: Path, epoch: int, respell: Respell) -> tuple[Path, int]:
    """Respell the text of user request ``topic N`` of ``epoch``, then reseal the session
    (every line's checksum and the sealed log's binding made to match, as a forger would)."""
    log = directory / f"{epoch}.jsonl"
    topic = f"topic {epoch * 10 + 3}".encode()
    written = b'"text":"%s"' % topic
    lines = log.read_bytes().split(b"\n")
    number = next(i for i, line in enumerate(lines, start=1) if written in line)
    lines[number - 1] = lines[number - 1].replace(written, respell(topic))
    log.write_bytes(b"\n".join(lines))
    reseal(directory)
    return log, number


@pytest.mark.parametrize("epoch", [0, 1], ids=["sealed", "newest"])
@pytest.mark.parametrize("forgery", FORGERIES.keys())
def test_verify_refuses_a_line_with_a_valid_checksum_that_the_writer_would_not_write(
    tmp_path: Path, forgery: str, epoch: int
) -> None:
    home = tmp_path / "home"
    respell, why = FORGERIES[forgery]
    log, line = _forge(_session(home), epoch, respell)
    with Session.open(home, "s") as session:  # open trusts the checksum: it loads
        assert len(session.records) == 21
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1, verified.stdout
    assert re.search(rf"REFUSED  s  {re.escape(f'{log}:{line}:')} .*{why}", verified.stdout), (
        verified.stdout
    )
    assert "1 sessions, 1 refused" in verified.stdout
    history = loopd("inspect", "--home", str(home), "s", "--all")
    assert history.returncode == 1
    assert history.stderr.startswith(f"{log}:{line}: "), history.stderr
    assert "Traceback" not in history.stderr
    newest = loopd("inspect", "--home", str(home), "s")  # what open reads, as open does
    assert newest.returncode == 0, newest.stderr


def test_verify_passes_the_same_session_unforged(tmp_path: Path) -> None:
    home = tmp_path / "home"
    reseal(_session(home))  # resealing changes no byte of lines the writer wrote
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout
    assert "1 sessions, 0 refused" in verified.stdout
