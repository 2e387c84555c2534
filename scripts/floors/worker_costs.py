"""Where a worker's time on one PostgreSQL-backed request goes: the server, the code, the wake-ups.

Issue 30's round-trip goal (``Client.send`` to ``loopd serve --store`` <= 1.3x a bare
psycopg INSERT + COMMIT) is missed by about 0.2x; ``bench_floors`` says the worker's own
work is the excess. This asks what that work is made of, in three parts:

- ``server``: the store's fenced INSERT (``INSERT ... SELECT ... FOR SHARE`` on the owner
  token) and a plain INSERT of the same bytes, each BEGIN, INSERT and COMMIT in one
  pipelined round trip, in turns on one server: what the fence costs the database.
- ``hot``: the worker's work on a request in a loop, caches warm, on a file-backed session
  on tmpfs (its fdatasync is next to free): the default App's turn (its four records
  encoded, written, learned), the state every reply carries, the reply's frame.
- ``in place``: the worker's CPU a request (its own counters, user and system, in the
  kernel's ticks of 10 ms: a run needs a few thousand requests) and the round trip,
  with ``Client.send`` back to back, then in turns with the bare INSERT + COMMIT as
  the goal's benchmark runs them.

Nothing here is asserted: ``--write-docs`` writes the section ``worker-costs`` of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from time import perf_counter, process_time

import psutil
import psycopg

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import machine_line
from scripts.harness.serve import start_serve, stop_serve
from scripts.postgres.bench_postgres import Bare, _last_chunk
from scripts.postgres.postgres_reference import ReferenceServer
from supervisor.client import Client, call
from worker.app import DefaultApp
from worker.ipc.wire import encode_reply, ok
from worker.loop.replies import describe
from worker.store.baseline import Baseline
from worker.store.postgres import PostgresStore
from worker.store.postgres.backend import _APPEND
from worker.store.postgres.pipeline import BINARY, TEXT, Prepared, write_pipelined
from worker.store.session import Session

TEXT_SENT = "hello there"
TMPFS = "/dev/shm"  # noqa: S108 - a private mkdtemp inside it, removed afterwards
_PLAIN = Prepared(
    name=b"plain_append",
    sql=b"INSERT INTO loopd_log_chunks (session, epoch, start, data) VALUES ($1, 1, $2, $3)",
    types=(25, 20, 17),
    formats=(TEXT, TEXT, BINARY),
)


def server_part(uri: str, count: int) -> dict[str, float]:
    """Median µs of a pipelined transaction, fenced and plain, in turns (after 50 each),
    and this process's CPU for a fenced one (libpq and the pipeline's Python)."""
    times: dict[str, list[float]] = {"fenced": [], "plain": []}
    cpu = 0.0
    conns = {}
    for name in times:
        conn = psycopg.connect(uri, autocommit=True)
        conn.execute("INSERT INTO loopd_sessions (session, owner_token) VALUES (%s, 1)", (name,))
        conns[name] = conn
    data = b"x" * 562
    try:
        for n in range(count + 50):
            for name in ("fenced", "plain") if n % 2 else ("plain", "fenced"):
                offset = b"%d" % (n * len(data))
                values: tuple[bytes, ...]
                if name == "fenced":
                    statement, values = _APPEND, (b"1", offset, data, name.encode(), b"1")
                else:
                    statement, values = _PLAIN, (name.encode(), offset, data)
                start, cpu_start = perf_counter(), process_time()
                write_pipelined(conns[name], statement, values, prepare=n == 0, on_sent=_nothing)
                if n >= 50:
                    times[name].append((perf_counter() - start) * 1e6)
                    cpu += (process_time() - cpu_start) if name == "fenced" else 0.0
    finally:
        for conn in conns.values():
            conn.close()
    medians = {
        f"{name} INSERT, pipelined: round trip": statistics.median(t) for name, t in times.items()
    }
    return {**medians, "fenced INSERT, pipelined: this process's CPU, mean": cpu / count * 1e6}


def _nothing() -> None:
    return None


def hot_part(count: int) -> dict[str, float]:
    """Median µs of each step of a request's work, in a loop (tmpfs: fdatasync is free)."""
    root = tempfile.mkdtemp(prefix="loopd-costs-", dir=TMPFS if os.path.isdir(TMPFS) else None)
    try:
        app = DefaultApp()
        with Session.create(root, "hot", Baseline(system="s", memory="", tools=[])) as session:
            steps = {
                "the App's turn (4 records encoded, written, learned)": lambda n: app.handle(
                    session, {"text": TEXT_SENT, "key": f"k{n}"}
                ),
                "the state a reply carries (describe)": lambda _n: describe(session),
                "the reply's frame": lambda n: encode_reply(
                    ok(n, {"text": "echo", "key": f"k{n}", "state": describe(session)})
                ),
            }
            return {name: _median_us(step, count) for name, step in steps.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _median_us(step: Callable[[int], object], count: int) -> float:
    times = []
    for n in range(count):
        start = perf_counter()
        step(n)
        times.append((perf_counter() - start) * 1e6)
    return statistics.median(times[count // 10 :])


def in_place_part(root: str, uri: str, count: int) -> dict[str, tuple[float, float, float]]:
    """(median round trip µs, the worker's user and system CPU µs a request) back to back,
    then in turns."""
    home = os.path.join(root, "home")
    daemon = start_serve(home, "--store", uri)
    bare = Bare(uri, "bare-costs")
    out: dict[str, tuple[float, float, float]] = {}
    try:
        call(home, "create", session="costs")
        with Client(home) as client:
            client.send("costs", TEXT_SENT, key="warm")
            worker = next(
                p for p in psutil.Process(daemon.pid).children() if p.name() == "loopd:costs"
            )
            sample = _last_chunk(uri, "costs")
            for mode in ("back to back", "in turns with the bare side"):
                sends: list[float] = []
                bares: list[float] = []
                before = worker.cpu_times()
                for n in range(count):
                    start = perf_counter()
                    client.send("costs", TEXT_SENT, key=f"{mode[:4]}{n}")
                    sends.append((perf_counter() - start) * 1e6)
                    if mode != "back to back":
                        start = perf_counter()
                        bare.insert(sample)
                        bares.append((perf_counter() - start) * 1e6)
                after = worker.cpu_times()
                user = (after.user - before.user) / count * 1e6
                system = (after.system - before.system) / count * 1e6
                out[mode] = (statistics.median(sends), user, system)
                if bares:
                    out["bare INSERT + COMMIT, in turns"] = (statistics.median(bares), 0.0, 0.0)
    finally:
        bare.close()
        stop_serve(daemon)
    return out


def render(
    server: dict[str, float],
    hot: dict[str, float],
    in_place: dict[str, tuple[float, float, float]],
    count: int,
) -> str:
    command = f"python -m scripts.floors.worker_costs --requests {count}"
    lines = [
        "<!-- worker-costs:start -->",
        "## Where a worker's time on a request goes (`scripts/floors/worker_costs.py`)",
        "",
        f"`{command}`; {machine_line()}.",
        "",
        "| part | measure | µs |",
        "|---|---|---:|",
    ]
    lines += [f"| server | {name} | {us:.0f} |" for name, us in server.items()]
    lines += [f"| hot | {name}, median | {us:.1f} |" for name, us in hot.items()]
    for mode, (trip, user, system) in in_place.items():
        lines.append(f"| in place | {mode}: round trip, median | {trip:.0f} |")
        if not mode.startswith("bare"):
            lines.append(
                f"| in place | {mode}: the worker's CPU a request, user + system "
                f"| {user:.0f} + {system:.0f} |"
            )
    lines.append("<!-- worker-costs:end -->")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per side and step")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-costs-")
    server = ReferenceServer()
    try:
        server.start()
        uri = server.uri()
        PostgresStore(uri).ensure_schema()
        figures_server = server_part(uri, args.requests)
        figures_hot = hot_part(args.requests)
        figures_in_place = in_place_part(root, uri, args.requests)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    section = render(figures_server, figures_hot, figures_in_place, args.requests)
    print(section)
    if args.write_docs:
        write_section("worker-costs", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
