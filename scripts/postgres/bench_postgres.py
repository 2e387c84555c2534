"""Benchmark the PostgreSQL store against bare psycopg on the same server (issue 30's goals).

    python -m scripts.postgres.bench_postgres [--rounds N] [--appends N] [--records N]
                                     [--opens N] [--no-serve] [--write-docs] [--json FILE]

It starts its own PostgreSQL (Debian's package, scripts/postgres/postgres_reference.py: a
temporary cluster on a unix socket, ``fsync=on``, the default ``synchronous_commit``)
and measures, in rounds where the sides take turns operation by operation:
- a durable append: ``Session.append_many`` of a typical group (a request's four
  records) on a ``PostgresStore`` session, against a bare psycopg ``INSERT`` +
  ``COMMIT`` of the same bytes into the same table on its own connection;
- with ``loopd serve --store`` (unless ``--no-serve``): one client's ``Client.send``
  to a session, against the same bare ``INSERT`` + ``COMMIT`` of the bytes the worker
  stored for a request;
- an open of a session of ``--records`` records (``Session.open``: connect, claim,
  load), against a bare connect + ``SELECT`` of its chunks (and, with no goal, the same
  followed by a ``json.loads`` of each line, or by the store's own decoding of the log,
  ``decode_log``: what open cannot do without): on a node that never opened it (a
  failover's), and again on a node whose home keeps the summary of its last open's scan
  (a restart's: docs/format.md, "The scan summary").
Each operation is timed alone; a side's figure is the median (and p99) of all its
operations, a ratio is the median of the per-round ratios of medians, with their
min-max. ``--write-docs`` replaces the PostgreSQL section of docs/benchmarks.md;
scripts/postgres/bench_postgres_compare.py runs this for an older commit and this tree in turns.
Every process started here is stopped and its directory removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psycopg

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.serve import start_serve, stop_serve
from scripts.postgres.bench_postgres_report import Figures, markdown
from scripts.postgres.postgres_reference import ReferenceServer
from supervisor.client import Client, call
from worker import Assistant, Baseline, Session, ToolResult, Usage, User
from worker.store.format.records import Record, encode_lines
from worker.store.format.scan_summary import ScanSummary
from worker.store.loader import decode_log
from worker.store.postgres import PostgresStore
from worker.store.postgres import backend as _backend


def _no_summary(data: bytes) -> ScanSummary | None:
    return None


# A tree from before its writer kept the summary in the database (bench_postgres_compare).
SUMMARY_NAME: str = getattr(_backend, "SUMMARY_NAME", "loopd.scan")
_summary_of_row: Callable[[bytes], ScanSummary | None] = getattr(
    _backend, "summary_of_row", _no_summary
)


BASELINE = Baseline(system="bench", memory="", tools=[])
_CALLS = itertools.count(1)  # a session's tool calls are numbered upwards
TEXT = "x" * 40  # a request's text, as in scripts/data_path/bench_data_path.py
_BARE_INSERT = "INSERT INTO loopd_log_chunks (session, epoch, start, data) VALUES (%s, 0, %s, %s)"


def group(n: int) -> list[Record]:
    """A typical request's records: the user's text, a tool's result, the answer, usage."""
    return [
        User(text=f"request {n} " + "u" * 40, key=f"k{n}"),
        ToolResult(call=next(_CALLS), tool="echo", output="o" * 60, ok=True),
        Assistant(text="a" * 80),
        Usage(prompt_tokens=n, completion_tokens=10, context_tokens=n + 10),
    ]


class Bare:
    """A bare psycopg writer: one INSERT + COMMIT per call, into a session row of its own."""

    def __init__(self, uri: str, session_id: str) -> None:
        self.conn = psycopg.connect(uri)  # not autocommit: psycopg's BEGIN, then COMMIT
        self.session_id = session_id
        self.offset = 0
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO loopd_sessions (session, owner_token) VALUES (%s, 1)", (session_id,)
            )
        self.conn.commit()

    def insert(self, data: bytes) -> None:
        self.conn.execute(_BARE_INSERT, (self.session_id, self.offset, data))
        self.conn.commit()
        self.offset += len(data)

    def close(self) -> None:
        self.conn.close()


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def interleave(
    figures: Figures,
    name: str,
    rounds: int,
    count: int,
    sides: dict[str, Callable[[int], object]],
    before: dict[str, Callable[[], object]] | None = None,
    pairs: list[tuple[str, str]] | None = None,
) -> None:
    """``count`` operations of each side per round, one of each side in turn.

    The sides take turns operation by operation, the order alternating, so that the
    other work on a shared machine (and its disk's fsync) weighs on every side alike.
    ``before``: what a side needs done before each of its operations, not timed;
    ``pairs``: the ratios to take (the first side over each other one by default).
    """
    prepare = before or {}
    order = list(sides)
    compared = pairs or [(order[0], other) for other in order[1:]]
    done = 0
    for _round in range(rounds):
        times: dict[str, list[float]] = {side: [] for side in order}
        for n in range(count):
            for side in order if n % 2 == 0 else order[::-1]:
                if side in prepare:
                    prepare[side]()
                times[side].append(timed(partial(sides[side], done + n)))
        medians: dict[str, float] = {}
        for side in order:
            figures.times.setdefault(f"{name}:{side}", []).extend(times[side])
            medians[side] = statistics.median(times[side])
        done += count
        for top, bottom in compared:
            figures.ratios.setdefault(f"{name}:{top}/{bottom}", []).append(
                medians[top] / medians[bottom]
            )


def bench_append(figures: Figures, uri: str, rounds: int, count: int) -> None:
    store = PostgresStore(uri)
    session = Session.create(store, "append", BASELINE)
    bare = Bare(uri, "bare-append")
    sample, _crc = encode_lines(group(0), 0)
    figures.facts["group_bytes"] = len(sample)
    try:
        for n in range(20):  # warm both connections and the server's caches
            session.append_many(group(1_000_000 + n))
            bare.insert(sample)
        interleave(
            figures,
            "append",
            rounds,
            count,
            {
                "append_many": lambda n: session.append_many(group(n)),
                "bare": lambda n: bare.insert(encode_lines(group(n), 0)[0]),
            },
        )
    finally:
        session.close()
        bare.close()


def bench_serve(figures: Figures, root: str, uri: str, rounds: int, count: int) -> None:
    home = os.path.join(root, "home")
    daemon = start_serve(home, "--store", uri)
    bare = Bare(uri, "bare-serve")
    try:
        call(home, "create", session="one")
        with Client(home) as client:
            reply = client.send("one", TEXT, key="warm")
            assert reply is not None
            sample = _last_chunk(uri, "one")  # the bare side writes the very bytes served
            figures.facts["request_bytes"] = len(sample)
            interleave(
                figures,
                "serve",
                rounds,
                count,
                {
                    "send": lambda n: client.send("one", TEXT, key=f"r{n}"),
                    "bare": lambda n: bare.insert(sample),
                },
            )
    finally:
        bare.close()
        stop_serve(daemon)


def _last_chunk(uri: str, session_id: str) -> bytes:
    """The bytes of the session's latest group commit, as the worker stored them."""
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT data FROM loopd_log_chunks WHERE session = %s ORDER BY epoch DESC, start DESC "
            "LIMIT 1",
            (session_id,),
        ).fetchone()
    assert row is not None
    return bytes(row[0])


def bench_open(
    figures: Figures, root: str, uri: str, records: int, rounds: int, count: int
) -> None:
    store = PostgresStore(uri)
    with Session.create(store, "big", BASELINE) as session:
        n = 0
        while len(session.records) < records:
            batch = group(n)[: records - len(session.records)]
            session.append_many(batch)
            n += 1
        figures.facts["open_records"] = len(session.records)
    query = (
        "SELECT start, data FROM loopd_log_chunks WHERE session = %s AND epoch = 0 ORDER BY start"
    )
    with psycopg.connect(uri) as probe:
        row = probe.execute(
            "SELECT count(*), sum(length(data)) FROM loopd_log_chunks WHERE session = 'big'"
        ).fetchone()
        assert row is not None
        figures.facts["open_chunks"], figures.facts["open_bytes"] = int(row[0]), int(row[1])

    def bare(_n: int) -> object:
        with psycopg.connect(uri, autocommit=True) as conn:
            return conn.execute(query, ("big",)).fetchall()

    def decoded(_n: int) -> object:
        with psycopg.connect(uri, autocommit=True) as conn:
            rows = conn.execute(query, ("big",)).fetchall()
        return [json.loads(line) for _start, data in rows for line in data.splitlines()]

    def store_decoded(_n: int) -> object:
        with psycopg.connect(uri, autocommit=True) as conn:
            rows = conn.execute(query, ("big",), binary=True).fetchall()
        return decode_log("0.jsonl", b"".join(bytes(data) for _start, data in rows))

    def opened(_n: int) -> object:
        with Session.open(store, "big") as again:
            return len(again.records)

    # A failover's node has no summary of its own: it takes the one the writer kept in
    # the database as its log grew (docs/format.md, "The scan summary"), and scans the
    # lines after it. Each open is given back the writer's, as a failover finds it (an
    # open that scanned enough puts a newer one, which the next would take).
    kept = _summary_row(uri)
    figures.facts["open_summary_behind"] = _bytes_after(uri, kept)

    def writers_summary() -> None:
        _put_summary_row(uri, kept)

    def no_summary() -> None:
        _put_summary_row(uri, None)

    sides: dict[str, Callable[[int], object]] = {
        "open": opened,
        "select": bare,
        "select+json": decoded,
        "select+decode": store_decoded,
        "open-unsummarized": opened,
    }
    before: dict[str, Callable[[], object]] = {
        "open": writers_summary, "open-unsummarized": no_summary,
    }  # fmt: skip
    pairs = [("open", side) for side in ("select", "select+json", "select+decode")]
    pairs.append(("open-unsummarized", "select"))
    interleave(figures, "open", rounds, count, sides, before, pairs)
    # Opens after an open that scanned the whole log and kept its summary in the database
    # (a restart after a clean stop: the summary covers every byte). A tree from before
    # the database kept summaries kept them in its node's home (bench_postgres_compare).
    _put_summary_row(uri, None)
    try:
        node = PostgresStore(uri, scans=os.path.join(root, "node-home"))  # type: ignore[call-arg]
    except TypeError:
        node = PostgresStore(uri)
    Session.open(node, "big").close()

    def reopened(_n: int) -> object:
        with Session.open(node, "big") as again:
            return len(again.records)

    interleave(figures, "reopen", rounds, count, {"reopen": reopened, "select": bare})


def _summary_row(uri: str) -> bytes | None:
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT data FROM loopd_files WHERE session = 'big' AND name = %s", (SUMMARY_NAME,)
        ).fetchone()
    return None if row is None else bytes(row[0])


def _put_summary_row(uri: str, blob: bytes | None) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("DELETE FROM loopd_files WHERE session = 'big' AND name = %s", (SUMMARY_NAME,))
        if blob is not None:
            conn.execute(
                "INSERT INTO loopd_files (session, name, data) VALUES ('big', %s, %s)",
                (SUMMARY_NAME, blob),
            )


def _bytes_after(uri: str, blob: bytes | None) -> int | None:
    """How many bytes of the log come after what the writer's summary covers."""
    summary = None if blob is None else _summary_of_row(blob)
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(length(data)) FROM loopd_log_chunks WHERE session = 'big'"
        ).fetchone()
    total = int(row[0]) if row is not None else 0
    return None if summary is None else total - summary.size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--appends", type=int, default=100, help="per side per round")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--opens", type=int, default=5, help="per side per round")
    parser.add_argument("--no-serve", action="store_true", help="skip loopd serve --store")
    parser.add_argument("--dir", default=None, help="where the server and home live")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    figures = Figures()
    root = tempfile.mkdtemp(prefix="loopd-bench-pg-", dir=args.dir)
    server = ReferenceServer()
    try:
        server.start()
        with psycopg.connect(server.uri(), autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        figures.facts["server"] = f"PostgreSQL {version[0] if version else '?'}"
        uri = server.uri()
        PostgresStore(uri).ensure_schema()
        bench_append(figures, uri, args.rounds, args.appends)
        if not args.no_serve:
            bench_serve(figures, root, uri, args.rounds, args.appends)
        bench_open(figures, root, uri, args.records, args.rounds, args.opens)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    figures.facts["machine"] = f"{platform.machine()}, {os.cpu_count()} cores (shared)"
    command = "python -m scripts.postgres.bench_postgres " + " ".join(sys.argv[1:])
    section = markdown(figures, command.strip())
    print(section)
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(figures)))
    if args.write_docs:
        write_section("postgres-bench", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
