"""What ``scripts.data_path.bench_redis`` measures of each round: rates, CPU, bytes, writes."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil


def _cpu(pid: int) -> float:
    """CPU seconds of every thread of ``pid``: the scheduler's nanoseconds where the kernel
    keeps them (psutil's figures count 10 ms ticks, too coarse for one block)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        total = 0
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                total += int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    return total / 1e9


def _write_calls(pid: int) -> int:
    """``write(2)``-family calls of ``pid`` so far (``send(2)`` is not one of them)."""
    with open(f"/proc/{pid}/io", encoding="ascii") as io:
        for line in io:
            if line.startswith("syscw:"):
                return int(line.split()[1])
    return 0


def _bytes_under(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(top, name)) for top, _dirs, files in os.walk(path)
        for name in files
    )  # fmt: skip


class Rounds:
    """Per-round rates of each measure, and CPU seconds and bytes per request summed."""

    def __init__(self) -> None:
        self.rates: dict[str, list[float]] = {}
        self.cpu: dict[str, float] = {}
        self.requests: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.writes: dict[str, int] = {}

    def run(
        self,
        name: str,
        count: int,
        block: Callable[[], float],
        cpu: dict[str, list[int]],
        disk: str | None = None,
        writers: list[int] | None = None,
        charged: int | None = None,
    ) -> None:
        """Time ``block`` (``count`` timed requests, ``charged`` in all: warm-ups too);
        charge it the CPU of ``cpu``'s processes, the bytes that appeared under ``disk``
        and the write calls of ``writers``."""
        before = {part: sum(map(_cpu, pids)) for part, pids in cpu.items()}
        size = _bytes_under(disk) if disk else 0
        writes = sum(map(_write_calls, writers or []))
        elapsed = block()
        for part, pids in cpu.items():
            key = f"{name}/{part}"
            self.cpu[key] = self.cpu.get(key, 0.0) + sum(map(_cpu, pids)) - before[part]
        if disk:
            self.bytes[name] = self.bytes.get(name, 0) + _bytes_under(disk) - size
        if writers:
            writes = sum(map(_write_calls, writers)) - writes
            self.writes[name] = self.writes.get(name, 0) + writes
        self.rates.setdefault(name, []).append(count / elapsed)
        self.requests[name] = self.requests.get(name, 0) + (charged or count)

    def ratio(self, top: str, bottom: str) -> list[float]:
        return [a / b for a, b in zip(self.rates[top], self.rates[bottom], strict=True)]

    def cpu_us(self, name: str, part: str) -> float:
        return self.cpu.get(f"{name}/{part}", 0.0) / self.requests[name] * 1e6

    def bytes_per_request(self, name: str) -> float:
        return self.bytes.get(name, 0) / self.requests[name]

    def writes_per_request(self, name: str, replies: int = 0) -> float:
        """``write(2)`` calls a request, less ``replies`` (Redis writes replies that way)."""
        return self.writes.get(name, 0) / self.requests[name] - replies
