"""The docs/benchmarks.md section of ``scripts.data_path.bench_redis``: its figures as a table,
each a median with its range over the rounds, beside its goal."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from scripts.data_path.bench_data_path import REQUEST_BYTES
from scripts.data_path.redis_rounds import Rounds
from scripts.harness.machine import machine_line


def _spread(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return f"{fmt.format(statistics.median(values))} ({fmt.format(low)}-{fmt.format(high)})"


def render(rounds: Rounds, facts: dict[str, Any], args: argparse.Namespace) -> str:
    n, count = args.clients, args.requests
    r = rounds.rates
    version = facts["version"]

    def us(name: str, part: str) -> str:
        return f"{rounds.cpu_us(name, part):.0f} µs"

    def row(what: str, loopd: str, redis: str, raw: str, goal: str = "-") -> str:
        return (
            f"| {what} | {_spread(r[loopd], '{:.0f}')}/s | {_spread(r[redis], '{:.0f}')}/s | "
            f"{_spread(r[raw], '{:.0f}')}/s | **{_spread(rounds.ratio(loopd, redis), '{:.2f}')}x**"
            f" | {_spread(rounds.ratio(loopd, raw), '{:.2f}')}x | "
            f"{_spread(rounds.ratio(redis, raw), '{:.2f}')}x | {goal} |"
        )

    lines = [
        "<!-- redis-bench:start -->",
        "## Against Redis (AOF, fsync always)",
        "",
        f"Command: `{facts['command']}`  ",
        f"{machine_line()}, {version}; files on {facts['fs']}; load average "
        f"{facts['load_before']:.1f} at the start, {facts['load_after']:.1f} at the end "
        f"(shared machine). {args.rounds} interleaved rounds, each measure's order rotated "
        f"every round; rates are median (min-max) over rounds, ratios the median (min-max) "
        f"of the per-round ratios.",
        "",
        f"Redis: `redis-server --port 0 --unixsocket ... --save \"\" --appendonly yes "
        f"--appendfsync always`, RESP over the unix socket, one `RPUSH` per request. loopd: "
        f"`loopd serve`, `supervisor.client.Client.send` (straight to the worker), the "
        f"default App. Raw: `os.write` + `os.fdatasync` of {len(REQUEST_BYTES)} bytes, about "
        f"what a loopd request writes (four records).",
        "",
        "| measure | loopd | Redis | raw loop | loopd / Redis | loopd / raw | Redis / raw "
        "| goal |",
        "|---|---|---|---|---|---|---|---|",
        row(f"one client, one request at a time ({count} a round): the request's key and "
            f"text", "loopd", "redis", "raw", "loopd / Redis >= 1x"),
        row(f"the same, Redis given {len(REQUEST_BYTES)} bytes a request (about what loopd "
            f"writes)",
            "loopd", "redis-bytes", "raw"),
        row(f"{n} client processes, one request at a time each ({args.per_client} each a "
            f"round): loopd on {n} sessions, Redis on {n} keys, {n} raw loops on {n} files",
            "loopd-n", "redis-n", "raw-n"),
        "",
        f"| per request | loopd, one client | Redis, one client | loopd, {n} clients | "
        f"Redis, {n} clients |",
        "|---|---|---|---|---|",
        f"| client CPU | {us('loopd', 'client')} | {us('redis', 'client')} | - | - |",
        f"| server CPU (loopd: the sessions' workers; Redis: redis-server) | "
        f"{us('loopd', 'worker')} | {us('redis', 'server')} (loopd's bytes: "
        f"{us('redis-bytes', 'server')}) | {us('loopd-n', 'server')} | "
        f"{us('redis-n', 'server')} |",
        f"| loopd's daemon CPU (not on the data path) | {us('loopd', 'daemon')} | - | - | - |",
        f"| writes to the log, each followed by one fdatasync (Redis: its write calls less "
        f"one reply) | {rounds.writes_per_request('loopd'):.2f} | "
        f"{rounds.writes_per_request('redis', 1):.2f} | "
        f"{rounds.writes_per_request('loopd-n'):.2f} | "
        f"{rounds.writes_per_request('redis-n', 1):.2f} |",
        f"| bytes appended to the log | {rounds.bytes_per_request('loopd'):.0f} | "
        f"{rounds.bytes_per_request('redis'):.0f} (loopd's bytes: "
        f"{rounds.bytes_per_request('redis-bytes'):.0f}) | - | - |",
        "",
        f"The disk's write + fdatasync in this run (the raw loop's median round): "
        f"{1e6 / statistics.median(r['raw']):.0f} µs.",
        "",
        "<!-- redis-bench:end -->",
    ]  # fmt: skip
    return "\n".join(lines)
