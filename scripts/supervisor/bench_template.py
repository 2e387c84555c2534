"""Template benchmark: a woken hibernated session's first request, and PSS per live worker,
for the default App and a heavy App, with templates (``--start-method template``),
without (``--start-method fork``) and as serve's default (``auto``: a template for every
App but the default one), side by side in one run.

    python -m scripts.supervisor.bench_template [--samples N] [--heavy-imports openai]

Each of the four runs builds a home of N sessions, starts ``loopd serve --idle-stop 600``
(every session rests hibernated), waits for the App's template to be ready (template
runs), then wakes each session with one request through a new connection (the time to
its reply), and with the N workers live sums their PSS (the template's apart).
``--heavy-imports`` names the heavy App's modules (examples/heavy_import_app.py;
``openai`` is not a dependency of loopd: install it by hand to measure with it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import psutil

from supervisor.client import Client, call
from supervisor.errors import ControlError
from worker import Session
from worker.app import DefaultApp

DEFAULT_APP = "worker.app:DefaultApp"
HEAVY_APP = "examples.heavy_import_app:HeavyImportApp"
READY = re.compile(r"template of App .*: ready \(pid (\d+)")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def answers(home: str) -> bool:
    try:
        call(home, "ping", timeout=5)
    except ControlError:
        return False
    return True


def pss(pid: int) -> int:
    return int(psutil.Process(pid).memory_full_info().pss)


def one_run(app: str, method: str, samples: int, heavy: str) -> dict[str, float]:
    home = tempfile.mkdtemp(prefix="loopd-bench-template-")
    names = [f"s{n:03d}" for n in range(samples)]
    for name in names:
        Session.create(home, name, DefaultApp().initial_baseline(name)).close()
    log_path = os.path.join(home, "serve.log")
    argv = [sys.executable, "-m", "supervisor", "serve", "--home", home, "--app", app,
            "--start-method", method, "--idle-stop", "600"]  # fmt: skip
    env = {**os.environ, "LOOPD_HEAVY_IMPORTS": heavy}
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: answers(home), 300, "serve to listen")
        template = None
        if method == "template" or (method == "auto" and app != DEFAULT_APP):

            def ready() -> bool:
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    return READY.search(f.read()) is not None

            wait_for(ready, 300, "the template")
            with open(log_path, encoding="utf-8", errors="replace") as f:
                found = READY.search(f.read())
            template = int(found.group(1)) if found else None
        woken = []
        for name in names:
            with Client(home, timeout=600) as client:
                started = time.perf_counter()
                client.send(name, "hello", key=f"wake-{name}")
                woken.append(time.perf_counter() - started)
        rows = call(home, "status")
        assert isinstance(rows, list)
        pids = [int(r["pid"]) for r in rows if r.get("state") == "RUNNING"]
        workers = sum(pss(pid) for pid in pids)
        return {
            "p50": percentile(woken, 0.5),
            "p99": percentile(woken, 0.99),
            "live": len(pids),
            "pss": workers / max(len(pids), 1),
            "template_pss": pss(template) if template is not None else 0,
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="hibernated sessions woken")
    parser.add_argument("--heavy-imports", default="openai", help="the heavy App's modules")
    args = parser.parse_args()
    results = {}
    for label, app in (
        ("default App", DEFAULT_APP),
        (f"heavy App ({args.heavy_imports})", HEAVY_APP),
    ):
        for method in ("fork", "template", "auto"):  # auto: serve's default
            print(f"  {label}, {method} ...", file=sys.stderr)
            results[(label, method)] = one_run(app, method, args.samples, args.heavy_imports)
    base = results[("default App", "template")]["pss"]
    print(f"{args.samples} hibernated sessions woken one by one, then all live; "
          f"{os.cpu_count()} cores\n")  # fmt: skip
    print("| App | start method | first request of a woken session p50 / p99 | "
          "PSS per live worker | vs default App (template) | template's PSS |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for (label, method), r in results.items():
        print(
            f"| {label} | {method} | {r['p50'] * 1000:.0f} / {r['p99'] * 1000:.0f} ms | "
            f"{r['pss'] / 2**20:.1f} MiB ({int(r['live'])} workers) | {r['pss'] / base:.2f}x | "
            + (f"{r['template_pss'] / 2**20:.1f} MiB |" if r["template_pss"] else "- |")
        )


if __name__ == "__main__":
    main()
