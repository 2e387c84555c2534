"""Floors: the least a process in loopd's place can cost, beside loopd and each goal's reference.

Three goals compare a request through loopd with a reference that has one process fewer
on its path, or none of loopd's work: one client's round trip against Redis (issue 32),
against a bare psycopg INSERT + COMMIT (issue 30), and an HTTP send against
``Client.send`` (issue 34). Each part here runs, side by side, the goal's two sides and a
relay (``scripts.floors.relays``): a process in the same place doing only what no
design of that place can skip. Where the relay alone is at or past a goal's line, the
goal cannot be met by any code in that process; where it is well inside, the gap is
the process's own work, and this says how much of it a goal leaves.

- ``file``: the raw loop (``os.write`` + ``os.fdatasync`` in this process), the file relay,
  Redis (``appendfsync always``, one ``RPUSH``), ``Client.send`` to ``loopd serve`` (the
  default App). Every side writes the bytes a loopd request writes.
- ``postgres``: bare psycopg INSERT + COMMIT (issue 30's reference), the PostgreSQL relay
  (one pipelined transaction), ``Client.send`` to ``loopd serve --store``.
- ``http``: ``Client.send``, the asyncio relay (the worker's own frames over loopback
  TCP through a process in the middle), the HTTP port with the minimal client.

Sides take turns request by request, the order rotated; a round's figure is each side's
median, a ratio the median (and range) of the rounds' ratios. ``--write-docs`` writes
the section ``floors`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from time import perf_counter

from scripts.data_path.redis_resp import Resp, start_redis, stop_redis
from scripts.floors.relays import FLOOR_SESSION
from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import filesystem_of, machine_line
from scripts.harness.serve import start_serve, stop_serve
from scripts.http.minimal_client import minimal_send
from scripts.postgres.bench_postgres import Bare, _last_chunk
from scripts.postgres.postgres_reference import ReferenceServer
from supervisor.client import Client, call
from worker.ipc.wire import FrameReader, encode
from worker.store.postgres import PostgresStore

TEXT = "hello there"
Side = Callable[[int], object]
Medians = dict[str, list[float]]
Facts = dict[str, object]


def interleave(sides: dict[str, Side], rounds: int, count: int) -> dict[str, list[float]]:
    """Each side's median µs per round; round 0 warms every side and is not kept."""
    names = list(sides)
    medians: dict[str, list[float]] = {name: [] for name in names}
    done = 0
    for r in range(rounds + 1):
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(count):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                start = perf_counter()
                sides[name](done + i)
                times[name].append((perf_counter() - start) * 1e6)
        done += count
        if r:
            for name in names:
                medians[name].append(statistics.median(times[name]))
    return medians


def _spawn(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scripts.floors.relays", *argv],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


@contextmanager
def relay_process(*argv: str) -> Iterator[tuple[str, int]]:
    """A relay started: its first line (``ready``, or the HTTP relay's port) and its pid;
    always ended."""
    proc = _spawn(*argv)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the relay {argv[0]} did not start")
        yield line, proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def unix_client(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    return sock


def exchange(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    if sock.recv(1) != b"k":
        raise RuntimeError("the relay ended")


def newest_log(home: str, session: str) -> str:
    directory = os.path.join(home, "sessions", session)
    epochs = [int(n[:-6]) for n in os.listdir(directory) if n.endswith(".jsonl")]
    return os.path.join(directory, f"{max(epochs)}.jsonl")


def request_bytes(home: str, client: Client, session: str) -> int:
    """The bytes one request appends to ``session``'s log (a keyed send of TEXT)."""
    log = newest_log(home, session)
    before = os.path.getsize(log)
    client.send(session, TEXT, key="measure-size")
    return os.path.getsize(log) - before


def file_part(root: str, rounds: int, count: int, facts: Facts) -> Medians:
    redis = shutil.which("redis-server")
    if redis is None:
        raise SystemExit("redis-server is not on PATH: apt-get install -y redis-server")
    home = os.path.join(root, "file-home")
    with ExitStack() as stack:
        daemon = start_serve(home)
        stack.callback(stop_serve, daemon)
        call(home, "create", session="one")
        client = stack.enter_context(Client(home))
        client.send("one", TEXT, key="warm")
        size = request_bytes(home, client, "one")
        facts["file_bytes"] = size
        facts["file_system"] = filesystem_of(root)
        sample = b"x" * (size - 1) + b"\n"
        raw_fd = os.open(os.path.join(root, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        stack.callback(os.close, raw_fd)
        path = os.path.join(root, "file-relay.sock")
        stack.enter_context(relay_process("file", os.path.join(root, "relay.log"), path, str(size)))
        relay = stack.enter_context(unix_client(path))
        proc, redis_path = start_redis(redis, os.path.join(root, "redis"))
        stack.callback(stop_redis, proc)
        resp = stack.enter_context(Resp(redis_path))

        def raw(_n: int) -> None:
            os.write(raw_fd, sample)
            os.fdatasync(raw_fd)

        return interleave(
            {
                "raw loop": raw,
                "relay": lambda _n: exchange(relay, sample),
                "Redis": lambda _n: resp.command("RPUSH", "list", sample),
                "loopd": lambda n: client.send("one", TEXT, key=f"f{n}"),
            },
            rounds,
            count,
        )


def postgres_part(root: str, rounds: int, count: int, facts: Facts) -> Medians | str:
    server = ReferenceServer()  # in the system's temp dir, which its own user reaches
    with ExitStack() as stack:
        try:
            server.start()
        except (RuntimeError, SystemExit) as exc:
            return f"skipped: {exc}"
        stack.callback(server.stop)
        uri = server.uri()
        PostgresStore(uri).ensure_schema()
        bare = Bare(uri, "floor-bare")
        stack.callback(bare.close)
        Bare(uri, FLOOR_SESSION).close()  # the relay's session row
        home = os.path.join(root, "pg-home")
        daemon = start_serve(home, "--store", uri)
        stack.callback(stop_serve, daemon)
        call(home, "create", session="one")
        client = stack.enter_context(Client(home))
        client.send("one", TEXT, key="warm")
        sample = _last_chunk(uri, "one")
        facts["postgres_bytes"] = len(sample)
        path = os.path.join(root, "pg-relay.sock")
        stack.enter_context(relay_process("postgres", uri, path, str(len(sample))))
        relay = stack.enter_context(unix_client(path))
        return interleave(
            {
                "bare INSERT + COMMIT": lambda _n: bare.insert(sample),
                "relay": lambda _n: exchange(relay, sample),
                "loopd": lambda n: client.send("one", TEXT, key=f"p{n}"),
            },
            rounds,
            count,
        )


def _tcp(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (the scheduler's nanoseconds)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
            total += int(stat.read().split()[0])
    return total / 1e9


def http_part(root: str, rounds: int, count: int, facts: Facts) -> Medians:
    home = os.path.join(root, "http-home")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = int(probe.getsockname()[1])
    with ExitStack() as stack:
        daemon = start_serve(home, "--http", f"127.0.0.1:{http_port}")
        stack.callback(stop_serve, daemon)
        call(home, "create", session="one")
        client = stack.enter_context(Client(home))
        client.send("one", TEXT, key="warm")
        line, relay_pid = stack.enter_context(relay_process("http", home, "one"))
        relay_port = int(line)
        relayed = stack.enter_context(_tcp(relay_port))
        reader = FrameReader()
        port_conn = [stack.enter_context(_tcp(http_port))]

        def through_relay(n: int) -> None:
            relayed.sendall(
                encode({"id": n, "op": "request", "request": {"text": TEXT, "key": f"r{n}"}})
            )
            while True:
                data = relayed.recv(65536)
                if not data:
                    raise RuntimeError("the HTTP relay ended")
                replies = reader.feed(data)
                if any(reply.get("id") == n for reply in replies):
                    return

        def through_port(n: int) -> None:
            if n % 500 == 0:  # the port ends a connection after 1,000 requests
                port_conn[0].close()
                port_conn[0] = _tcp(http_port)
            minimal_send(port_conn[0], "one", f"h{n}")

        before = {"relay": cpu_seconds(relay_pid), "HTTP port": cpu_seconds(daemon.pid)}
        medians = interleave(
            {
                "Client.send": lambda n: client.send("one", TEXT, key=f"c{n}"),
                "relay": through_relay,
                "HTTP port": through_port,
            },
            rounds,
            count,
        )
        sends = (rounds + 1) * count
        facts["http_cpu"] = {
            "relay": (cpu_seconds(relay_pid) - before["relay"]) / sends * 1e6,
            "HTTP port": (cpu_seconds(daemon.pid) - before["HTTP port"]) / sends * 1e6,
        }
        return medians


def _row(name: str, medians: list[float], reference: list[float], rate: bool) -> str:
    ratios = [(r / m if rate else m / r) for m, r in zip(medians, reference, strict=True)]
    return (
        f"| {name} | {statistics.median(medians):.0f} | {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}) |"
    )


def table(part: dict[str, list[float]], reference: str, rate: bool) -> str:
    what = f"rate / {reference}'s" if rate else f"time / {reference}'s"
    lines = [f"| side | median µs | {what} |", "|---|---:|---:|"]
    lines += [_row(name, m, part[reference], rate) for name, m in part.items()]
    return "\n".join(lines)


def _shown(part: Medians | str, reference: str, *, rate: bool) -> str:
    return table(part, reference, rate) if isinstance(part, dict) else part


def render(parts: dict[str, Medians | str], facts: Facts, args: argparse.Namespace) -> str:
    command = (
        f"python -m scripts.floors.bench_floors --rounds {args.rounds} --requests {args.requests}"
    )
    out = [
        "<!-- floors:start -->",
        "## Floors: a relay in loopd's place (`scripts/floors/bench_floors.py`)",
        "",
        f"`{command}`; {machine_line()}; a home on {facts.get('file_system', '?')}. "
        f"{args.rounds} rounds of {args.requests} requests a side, in turns.",
        "",
        f"**File store against Redis** (every side writes {facts.get('file_bytes')} bytes a "
        "request; a rate ratio, goal of issue 32: loopd >= 1.0x Redis):",
        "",
        _shown(parts["file"], "Redis", rate=True),
        "",
        f"**PostgreSQL** ({facts.get('postgres_bytes')} bytes a request; a time ratio, goal "
        "of issue 30: loopd <= 1.3x the bare INSERT + COMMIT):",
        "",
    ]
    out += [_shown(parts["postgres"], "bare INSERT + COMMIT", rate=False), ""]
    out += [
        "**HTTP** (a time ratio, goal of issue 34: the HTTP port <= 1.3x `Client.send`):",
        "",
        _shown(parts["http"], "Client.send", rate=False),
    ]
    cpu = facts.get("http_cpu")
    if isinstance(cpu, dict):
        out += ["", "CPU a request of the process in the middle: "
                + ", ".join(f"{name} {us:.0f} µs" for name, us in cpu.items())
                + " (the HTTP port: serve's, all threads)."]  # fmt: skip
    out.append("<!-- floors:end -->")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="a side, a round")
    parser.add_argument("--dir", default=None, help="where everything writes (default: a temp dir)")
    parser.add_argument("--parts", default="file,postgres,http")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-floors-", dir=args.dir)
    facts: dict[str, object] = {}
    parts: dict[str, Medians | str] = {
        "file": "not run", "postgres": "not run", "http": "not run"
    }  # fmt: skip
    wanted = args.parts.split(",")
    try:
        if "file" in wanted:
            parts["file"] = file_part(root, args.rounds, args.requests, facts)
        if "postgres" in wanted:
            parts["postgres"] = postgres_part(root, args.rounds, args.requests, facts)
        if "http" in wanted:
            parts["http"] = http_part(root, args.rounds, args.requests, facts)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    section = render(parts, facts, args)
    print(section)
    if args.write_docs:
        write_section("floors", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
