"""Sessions of the default App written straight through the store, for the offline tools' tests."""

from __future__ import annotations

from pathlib import Path

from worker import Assistant, Baseline, Session, ToolResult, Usage, User
from worker.app import DefaultApp


def keyed_session(home: Path, name: str, epochs: int = 1, pairs: int = 3) -> Path:
    """A session of the default App with ``pairs`` keyed requests in each epoch."""
    baseline = DefaultApp().initial_baseline(name)
    with Session.create(home, name, baseline) as session:
        for n in range(epochs):
            for k in range(pairs):
                key = f"{name}-{n}-{k}"
                session.append_many([User(text=f"topic {n} {k}", key=key), Assistant(text="a")])
            if n < epochs - 1:
                session.commit_epoch(f"sum {n}", baseline)
    return home / "sessions" / name


FIXED_TIME = "2026-11-29T20:17:57.123456Z"  # one time for every record: lines compare whole


def four_record_request(n: int, call: int) -> list[User | ToolResult | Assistant | Usage]:
    """The four records the default App writes for keyed request ``n``, at ``FIXED_TIME``."""
    return [
        User(time=FIXED_TIME, text=f"u{n}", key=f"k{n}"),
        ToolResult(time=FIXED_TIME, call=call, tool="echo", output=f"u{n}", ok=True),
        Assistant(time=FIXED_TIME, text=f"a{n}"),
        Usage(time=FIXED_TIME, prompt_tokens=1, completion_tokens=1, context_tokens=n + 2),
    ]


def four_record_session(home: Path, baseline: Baseline, requests: int = 2) -> Path:
    """Session ``s1`` whose log holds ``requests`` keyed four-record groups; its log's path."""
    with Session.create(home, "s1", baseline) as session:
        for n in range(requests):
            session.append_many(four_record_request(n, session.next_call()))
        return Path(session.log_path)
