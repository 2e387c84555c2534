"""Sessions for the scan summary's tests (docs/format.md, "The scan summary"): a log of
keyed requests past the size that keeps a summary, and what a scan of it reads."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from worker.app import DefaultApp
from worker.store.format.line_scan import LineScan
from worker.store.format.records import Assistant, Record, ToolResult, Usage, User
from worker.store.session import Session

SESSION = "big"


def scan_fields(scan: LineScan | None) -> tuple[object, ...]:
    assert scan is not None
    return (scan.types, scan.calls, scan.users, scan.keys, scan.crc, scan.adler)


def request(session: Session, n: int, key: str | None = None) -> list[Record]:
    return [
        User(text=f"request {n}", key=f"k{n}" if key is None else key),
        ToolResult(call=session.next_call(), tool="echo", output=f"request {n}", ok=True),
        Assistant(text=f"echo: request {n}"),
        Usage(prompt_tokens=3, completion_tokens=4, context_tokens=7),
    ]


def big_session(home: str, requests: int = 400, *, kept: bool = False) -> None:
    """``requests`` keyed requests of the default App, a group each: about 140 KiB; the
    summary its writer kept removed unless ``kept`` (a log no open has scanned yet)."""
    with Session.create(home, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
        for n in range(requests):
            session.append_many(request(session, n))
    if not kept:
        shutil.rmtree(os.path.join(home, "scans"), ignore_errors=True)


def log_of(home: str) -> str:
    return os.path.join(home, "sessions", SESSION, "0.jsonl")


@pytest.fixture
def big_home() -> Iterator[str]:
    """A home holding a session of 400 keyed requests (``big_session``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        home = os.path.join(root, "home")
        big_session(home)
        yield home
