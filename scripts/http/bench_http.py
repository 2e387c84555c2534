"""The HTTP API (``loopd serve --http``) side by side with the Python client, and under load.

    python -m scripts.http.bench_http [--rounds N] [--requests N] [--turns N] [--followers N]
                                 [--ticks N] [--dir D] [--write-docs]

One ``loopd serve --http`` on a temporary home, its App ``scripts.http.bench_http_app:TickApp``
(the default App, and ``ticks N pause S`` streams N partials, each stamped with the
monotonic clock at its ``stream()`` call). Measured:

- round trip: one client, one session, one request at a time, keyed: an HTTP send
  (``http.client``, a kept-alive connection) against ``Client.send``, one request of
  each in turn (the order rotated); a round's figure is its median request, the ratio
  the median of the rounds' ratios. Also a send by a minimal HTTP client (one
  ``sendall``, the answer read by its Content-Length, as curl's or Node's cost next to
  nothing): ``http.client`` alone spends more CPU on a request than ``Client.send``
  does, and this row is the port's own share;
- first partial: a streamed send of one partial, from the App's ``stream()`` call to
  the partial read by the client (the clock is the machine's monotonic one, the same in
  every process): over SSE, against ``Client.stream`` side by side;
- concurrent event streams: ``--turns`` sessions each run one streamed request of
  ``--ticks`` partials, each followed by ``--followers`` SSE clients at once (the first
  to connect starts it, the others join it by its key), every client dropping its
  connection at a random event up to twice and reconnecting with ``Last-Event-ID``.
  Each client must read every partial once, in order, then the reply: no gap, no
  duplicate. The serve process's RSS is sampled throughout.

Every process started here is stopped and the temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.serve import start_serve as _start_daemon
from scripts.harness.serve import stop_serve as _stop_daemon
from scripts.http.minimal_client import minimal_send
from supervisor.client import Client

APP = "scripts.http.bench_http_app:TickApp"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _create(port: int, session: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/sessions", json.dumps({"id": session}),
                 {"Content-Type": "application/json"})  # fmt: skip
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    if answer.status != 201:
        raise RuntimeError(f"create {session}: {answer.status} {body[:200]!r}")


def _connection(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    # http.client sends a request's head and body in two writes: without TCP_NODELAY the
    # body waits for the head's delayed ACK (curl, browsers and Node set it too).
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def round_trip(home: str, port: int, rounds: int, count: int) -> dict[str, Any]:
    _create(port, "rt")
    client = Client(home)
    conn = _connection(port)
    headers = {"Content-Type": "application/json"}

    def over_http(key: str) -> None:
        nonlocal conn
        if key.endswith("-0"):  # a connection a round: serve ends one after 1,000 requests
            conn.close()
            conn = _connection(port)
        conn.request("POST", "/v1/sessions/rt/requests", json.dumps({"text": "hello there"}),
                     {**headers, "Idempotency-Key": key})  # fmt: skip
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"HTTP send: {answer.status}")

    raw = _connection(port).sock
    assert raw is not None

    def minimal(key: str) -> None:
        nonlocal raw
        if key.endswith("-0"):
            raw.close()
            raw = _connection(port).sock
            assert raw is not None
        minimal_send(raw, "rt", key)

    def direct(key: str) -> None:
        client.send("rt", "hello there", key=key)

    sides = {"http": over_http, "minimal": minimal, "client": direct}
    per_round: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds + 1):  # round 0 warms them up and is not counted
        # One request of each side in turn, the order rotated: a burst of the machine's
        # other load falls on all three alike; a round's figure is its median request.
        times: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(count):
            for name in list(sides)[i % 3 :] + list(sides)[: i % 3]:
                start = time.perf_counter()
                sides[name](f"{name}-{r}-{i}")
                times[name].append((time.perf_counter() - start) * 1e6)
        if r:
            for name, taken in times.items():
                per_round[name].append(statistics.median(taken))
    conn.close()
    raw.close()
    client.close()
    ratios = [h / c for h, c in zip(per_round["http"], per_round["client"], strict=True)]
    minimal_ratios = [m / c for m, c in zip(per_round["minimal"], per_round["client"], strict=True)]
    return {
        "http_us": statistics.median(per_round["http"]),
        "minimal_us": statistics.median(per_round["minimal"]),
        "client_us": statistics.median(per_round["client"]),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
        "minimal_ratio": statistics.median(minimal_ratios),
        "minimal_ratio_range": (min(minimal_ratios), max(minimal_ratios)),
    }


def _sse_first_partial(port: int, session: str, key: str) -> float:
    """Milliseconds from the App's stream() call to its partial read over SSE."""
    body = json.dumps({"text": "ticks 1 pause 0"}).encode()
    head = (
        f"POST /v1/sessions/{session}/requests HTTP/1.1\r\nHost: bench\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head + body)
        data = b""
        latency = None
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if latency is None and b"event: partial\ndata: " in data:
                line = data.split(b"event: partial\ndata: ", 1)[1]
                if b"\n" in line:
                    text = json.loads(line.split(b"\n", 1)[0])["text"]
                    latency = (time.monotonic_ns() - int(text.split()[1])) / 1e6
    if latency is None:
        raise RuntimeError(f"no partial in {data[-300:]!r}")
    return latency


def first_partial(home: str, port: int, count: int) -> dict[str, Any]:
    _create(port, "fp")
    client = Client(home)
    sse: list[float] = []
    direct: list[float] = []
    for i in range(count + 5):  # the first five warm up and are not counted
        order = ("sse", "client") if i % 2 else ("client", "sse")
        for side in order:
            if side == "sse":
                value = _sse_first_partial(port, "fp", f"sse-{i}")
            else:
                stream = client.stream("fp", "ticks 1 pause 0", key=f"client-{i}")
                first = next(iter(stream))
                value = (time.monotonic_ns() - int(first.split()[1])) / 1e6
                for _rest in stream:
                    pass
            if i >= 5:
                (sse if side == "sse" else direct).append(value)
    client.close()
    return {"sse": _percentiles(sse), "client": _percentiles(direct)}


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "n": float(len(ordered)),
    }


@dataclass
class Follower:
    session: str
    key: str
    seen: list[int] = field(default_factory=list)
    replies: int = 0
    reconnects: int = 0
    problems: list[str] = field(default_factory=list)


async def _follow(port: int, follower: Follower, text: str, total: int, seed: int) -> None:
    rng = random.Random(seed)
    last = 0
    body = json.dumps({"text": text}).encode()
    while True:
        resume = f"Last-Event-ID: {last}\r\n" if last else ""
        head = (
            f"POST /v1/sessions/{follower.session}/requests HTTP/1.1\r\nHost: bench\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Idempotency-Key: {follower.key}\r\n{resume}Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + body)
        cut_at = rng.randint(last + 1, total) if follower.reconnects < 2 and last < total else 0
        buffer = b""
        done = False
        status = await reader.readuntil(b"\r\n\r\n")
        if not status.startswith(b"HTTP/1.1 200"):
            follower.problems.append(status.split(b"\r\n", 1)[0].decode())
            writer.close()
            return
        while not done:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for raw in events:
                fields = dict(
                    line.split(": ", 1) for line in raw.decode().split("\n") if ": " in line
                )
                kind = fields.get("event")
                if kind == "partial":
                    last = int(fields["id"])
                    follower.seen.append(last)
                elif kind == "reply":
                    follower.replies += 1
                    done = True
                elif kind is not None:
                    follower.problems.append(f"a {kind} event: {fields.get('data')}")
                    done = True
            if cut_at and last >= cut_at and not done:
                break  # drop the connection here, and come back
        writer.close()
        if done or follower.problems:
            return
        follower.reconnects += 1


def concurrent_streams(
    port: int, proc_pid: int, turns: int, followers: int, ticks: int
) -> dict[str, Any]:
    sessions = [f"s{n}" for n in range(turns)]
    for session in sessions:
        _create(port, session)
    serve = psutil.Process(proc_pid)
    base = serve.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], serve.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    everyone = [Follower(s, f"stream-{s}") for s in sessions for _ in range(followers)]
    text = f"ticks {ticks} pause 0.03"

    async def run_all() -> None:
        await asyncio.gather(
            *(_follow(port, f, text, ticks, seed) for seed, f in enumerate(everyone))
        )

    start = time.monotonic()
    asyncio.run(run_all())
    took = time.monotonic() - start
    stop.set()
    sampler.join()
    whole = [f for f in everyone if f.seen == list(range(1, ticks + 1)) and f.replies == 1]
    broken = [f for f in everyone if f not in whole]
    return {
        "clients": len(everyone),
        "whole": len(whole),
        "reconnects": sum(f.reconnects for f in everyone),
        "problems": [(f.session, f.problems or f.seen[:5]) for f in broken[:5]],
        "seconds": took,
        "rss_base_mib": base / 2**20,
        "rss_peak_mib": peak[0] / 2**20,
    }


def render(
    rt: dict[str, Any], fp: dict[str, Any], cs: dict[str, Any], args: argparse.Namespace
) -> str:
    lo, hi = rt["ratio_range"]
    sse, direct = fp["sse"], fp["client"]
    command = (
        f"python -m scripts.http.bench_http --rounds {args.rounds} --requests {args.requests} "
        f"--turns {args.turns} --followers {args.followers} --ticks {args.ticks}"
    )
    rows = [
        f"| keyed send round trip, one client, one session | {rt['http_us']:.0f} µs | "
        f"{rt['client_us']:.0f} µs | {rt['ratio']:.2f}x, {lo:.2f}-{hi:.2f} over rounds "
        "(≤ 1.3x) |",
        f"| the same, a minimal HTTP client | {rt['minimal_us']:.0f} µs | {rt['client_us']:.0f} µs "
        f"| {rt['minimal_ratio']:.2f}x, {rt['minimal_ratio_range'][0]:.2f}-"
        f"{rt['minimal_ratio_range'][1]:.2f} over rounds |",
        f"| first partial, from `stream()` to the client, p50 / p99 | {sse['p50']:.2f} / "
        f"{sse['p99']:.2f} ms | {direct['p50']:.2f} / {direct['p99']:.2f} ms | "
        "(≤ 5 ms on a quiet machine) |",
    ]
    table = "\n".join(rows)
    return f"""<!-- http:start -->
## The HTTP API (`scripts/http/bench_http.py`)

`{command}` on this machine ({os.cpu_count()} cores, shared; a home on the temp dir):

| measure | HTTP | `Client` | ratio (goal) |
|---|---|---|---|
{table}

{cs["clients"]} SSE clients at once ({args.turns} streamed requests of {args.ticks} partials
30 ms apart, {args.followers} clients following each, each dropping its connection at a random
event up to twice and reconnecting with `Last-Event-ID`: {cs["reconnects"]} reconnects):
{cs["whole"]} of {cs["clients"]} read every partial once, in order, then the reply, in
{cs["seconds"]:.1f} s. The serve process's RSS went from {cs["rss_base_mib"]:.0f} MiB to at
most {cs["rss_peak_mib"]:.0f} MiB (its bound: docs/http.md, "Limits of the port").
<!-- http:end -->"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--followers", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-http-", dir=args.dir)
    home = os.path.join(root, "home")
    port = _free_port()
    proc = _start_daemon(home, "--http", f"127.0.0.1:{port}", "--app", APP)
    try:
        rt = round_trip(home, port, args.rounds, args.requests)
        print(f"round trip: {rt}", flush=True)
        fp = first_partial(home, port, args.requests)
        print(f"first partial: {fp}", flush=True)
        cs = concurrent_streams(port, proc.pid, args.turns, args.followers, args.ticks)
        print(f"concurrent streams: {cs}", flush=True)
    finally:
        _stop_daemon(proc)
        shutil.rmtree(root, ignore_errors=True)
    section = render(rt, fp, cs, args)
    print(section)
    if args.write_docs:
        write_section("http", section)
    return 0 if cs["whole"] == cs["clients"] else 1


if __name__ == "__main__":
    sys.exit(main())
