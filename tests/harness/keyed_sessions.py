"""Sessions of the default App written straight through the store, for the offline tools' tests."""

from __future__ import annotations

from pathlib import Path

from worker import Assistant, Session, User
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
