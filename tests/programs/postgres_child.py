"""A child process that holds a PostgreSQL session and is SIGKILLed where a test wants a crash.

``python -m tests.programs.postgres_child URI SESSION between-phases``: open the session and
commit its epoch, killed by SIGKILL after phase 1 (the EpochEnd committed) and before
phase 2 (the next epoch's rows).
"""

from __future__ import annotations

import os
import signal
import sys

from worker import Baseline, Session
from worker.store.postgres import PostgresSession, PostgresStore

SUMMARY = "the summary phase 1 recorded"


def main() -> None:
    uri, session_id, where = sys.argv[1:]
    if where != "between-phases":
        raise SystemExit(f"unknown crash point {where!r}")

    def die(*_args: object) -> tuple[object, int, int]:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("SIGKILL returned")

    PostgresSession._write_next_epoch = die  # type: ignore[method-assign,assignment]
    session = Session.open(PostgresStore(uri), session_id)
    print("open", flush=True)
    session.commit_epoch(SUMMARY, Baseline(system="next", memory="", tools=[]))


if __name__ == "__main__":
    main()
