"""What the template's audit hook costs a worker: its price per audited event, against an
interpreter without it, and how many audited events a worker raises per request.

    python -m scripts.supervisor.bench_audit_hook [--rounds N] [--requests N] [--write-docs]

A template adds the hook of supervisor/templates/watched_files.py before its App's import
and every worker it forks inherits it, idle (docs/templates.md). Per event: fresh
interpreters, with the idle hook and without, alternated round by round (the machine is
shared), each timing ``sys.audit`` and an ``open`` + ``close`` of a file; the medians and
their ratio. Per request: a ``loopd serve`` whose App (CountingApp, below) counts in its
worker the audited events raised between two of its requests, and that worker's CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import machine_line
from scripts.harness.serve import start_serve, stop_serve
from supervisor.client import Client, call
from supervisor.templates import watched_files
from worker.app import DefaultApp, Message, Session

TAG = "audit-hook-bench"
_TIMED = """
import sys, timeit
from supervisor.templates.watched_files import ImportReads, recording_reads
if sys.argv[1] == "hook":
    with recording_reads(ImportReads()):
        pass  # the hook is added, and idle from here on, as in a worker
audits = min(timeit.repeat("audit('loopd.bench', 1, 2)", "from sys import audit",
                           number=1_000_000, repeat=5)) / 1_000_000
opens = min(timeit.repeat(f"open({sys.argv[2]!r}).close()", number=20_000, repeat=5)) / 20_000
print(audits * 1e9, opens * 1e9)
"""


class CountingApp(DefaultApp):
    """The default App, answering with the audited events its worker raised so far."""

    def __init__(self, budget: int = 4000) -> None:
        super().__init__(budget)
        self.events = 0
        sys.addaudithook(self._count)  # in the worker: the factory is called there

    def _count(self, event: str, args: tuple[object, ...]) -> None:
        self.events += 1

    def handle(self, session: Session, request: Message) -> Message:
        reply = super().handle(session, request)
        return {**reply, "events": self.events, "hooked": watched_files.hook_added()}


def per_event(rounds: int) -> dict[str, tuple[float, float]]:
    """Median ns of one ``sys.audit`` and of one open + close, without and with the hook."""
    seen: dict[str, list[tuple[float, float]]] = {"none": [], "hook": []}
    for _ in range(rounds):
        for mode, rows in seen.items():
            out = subprocess.run(
                [sys.executable, "-c", _TIMED, mode, __file__],
                capture_output=True, text=True, check=True, timeout=300,
            ).stdout.split()  # fmt: skip
            rows.append((float(out[0]), float(out[1])))
    return {
        mode: (statistics.median(a for a, _ in rows), statistics.median(o for _, o in rows))
        for mode, rows in seen.items()
    }


def per_request(requests: int) -> tuple[float, float]:
    """Audited events per request of a template-forked worker, and its CPU us per request."""
    with tempfile.TemporaryDirectory(prefix="loopd-audit-") as home:
        proc = start_serve(home, "--app", "scripts.supervisor.bench_audit_hook:CountingApp")
        try:
            call(home, "create", session="s", timeout=60)
            with Client(home, timeout=60) as client:
                deadline = time.monotonic() + 120
                while not (first := client.send("s", "warm"))["hooked"]:
                    if time.monotonic() > deadline:  # its template never became ready
                        raise RuntimeError("no worker forked from a template")
                    call(home, "restart", session="s", timeout=60)  # forked while it imported
                    time.sleep(0.1)
                worker = psutil.Process(_pid(call(home, "status", session="s")))
                cpu = sum(worker.cpu_times()[:2])
                for n in range(requests):
                    last = client.send("s", f"hello {n}")
                cpu = sum(worker.cpu_times()[:2]) - cpu
        finally:
            stop_serve(proc)
    events = (int(str(last["events"])) - int(str(first["events"]))) / requests
    return events, cpu / requests * 1e6


def _pid(rows: object) -> int:
    if not isinstance(rows, list) or not isinstance(rows[0], dict):
        raise TypeError(f"not status rows: {rows!r}")
    return int(str(rows[0]["pid"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--write-docs", action="store_true")
    options = parser.parse_args()
    costs = per_event(options.rounds)
    events, cpu = per_request(options.requests)
    (audit_none, open_none), (audit_hook, open_hook) = costs["none"], costs["hook"]
    extra = audit_hook - audit_none
    section = "\n".join([
        f"<!-- {TAG}:start -->",
        "## The template's audit hook, idle in a worker",
        "",
        "| | without the hook | with it, idle | ratio |",
        "|---|---|---|---|",
        f"| one `sys.audit` | {audit_none:.0f} ns | {audit_hook:.0f} ns "
        f"| {audit_hook / audit_none:.1f}x |",
        f"| one `open` + `close` | {open_none:.0f} ns | {open_hook:.0f} ns "
        f"| {open_hook / open_none:.2f}x |",
        "",
        f"A template-forked worker of the default App raised {events:.1f} audited events "
        f"per request and spent {cpu:.0f} us of CPU on each: the idle hook's share is "
        f"about {events * extra / 1000:.2f} us a request ({events * extra / 10 / cpu:.2f}% "
        f"of the worker's CPU), at {extra:.0f} ns an event.",
        "",
        f"Command: `python -m scripts.supervisor.bench_audit_hook --rounds {options.rounds}"
        f" --requests {options.requests}`  ",
        f"{machine_line()}, load average {psutil.getloadavg()[0]:.1f} at the end.",
        f"<!-- {TAG}:end -->",
    ])  # fmt: skip
    print(section)
    if options.write_docs:
        write_section(TAG, section)


if __name__ == "__main__":
    main()
