"""Restart latency of a session with a long history vs the same current epoch alone.

    python -m scripts.store.bench_history_restart [--epochs N] [--kills N] [--write-docs]

One supervisor hosts three sessions whose current epoch holds the same 1,000 records:
``alone`` (no older epochs), ``history`` (N older epochs of 1,000 records each, written
by this version: each SessionStart carries the older epochs' state) and ``old`` (the
same history with the carried state stripped, as a log written before it existed,
which open reads whole). Their workers are SIGKILLed in turn, and the time from the
kill to the next request answered (sent with its key and retried, as a client does) is
measured: a ratio side by side in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from scripts.harness.benchmarks_doc import write_section
from scripts.store.bench_store import _make_history, _strip_carried
from scripts.supervisor.bench_supervisor import _poll
from supervisor.client import call, call_with_retry
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError

PER_EPOCH = 1000


def _status(home: str, session: str) -> dict[str, object]:
    rows = call(home, "status", session=session)
    assert isinstance(rows, list)
    row = rows[0]
    assert isinstance(row, dict)
    return row


def _serving(home: str) -> bool:
    try:
        return all(_status(home, s)["state"] == "RUNNING" for s in ("alone", "history", "old"))
    except ControlError:
        return False


def measure(root: str, epochs: int, kills: int) -> dict[str, float]:
    home = os.path.join(root, "home")
    _make_history(home, "alone", 1, PER_EPOCH)
    _make_history(home, "history", epochs + 1, PER_EPOCH)
    _make_history(home, "old", epochs + 1, PER_EPOCH)
    _strip_carried(os.path.join(home, "sessions", "old"))
    serve = [sys.executable, "-m", "supervisor", "serve", "--home", home]
    daemon = subprocess.Popen(
        [*serve, "--max-restarts", "100000", "--start-retries", "100000", "--stable-after", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies: dict[str, list[float]] = {"alone": [], "history": [], "old": []}
    try:
        _poll(lambda: os.path.exists(os.path.join(home, SOCKET_NAME)) and _serving(home))
        for n in range(kills):
            for session, found in latencies.items():
                pid = _status(home, session)["pid"]
                assert isinstance(pid, int)
                start = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                call_with_retry(
                    home, "send", session=session, text=f"after kill {n}",
                    key=f"kill-{session}-{n}", deadline=time.monotonic() + 60,
                )  # fmt: skip
                found.append(time.perf_counter() - start)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    alone = statistics.median(latencies["alone"])
    return {
        "epochs": float(epochs),
        "kills": float(kills),
        "alone_ms": alone * 1000,
        "history_ms": statistics.median(latencies["history"]) * 1000,
        "old_ms": statistics.median(latencies["old"]) * 1000,
        "history_vs_alone": statistics.median(latencies["history"]) / alone,
        "old_vs_alone": statistics.median(latencies["old"]) / alone,
    }


def _markdown(figures: dict[str, float], command: str) -> str:
    return "\n".join(
        [
            "<!-- history-restart-bench:start -->",
            "## Restart cost and history",
            "",
            f"Command: `{command}`",
            "",
            "| measure | median | ratio to the current epoch alone | goal |",
            "|---|---|---|---|",
            f"| restart latency, SIGKILL to the next request answered: 1,000-record current "
            f"epoch alone | {figures['alone_ms']:.1f} ms | 1 | - |",
            f"| the same current epoch behind {figures['epochs']:.0f} older epochs of 1,000 "
            f"records | {figures['history_ms']:.1f} ms | {figures['history_vs_alone']:.2f}x "
            "| <= 1.2x |",
            f"| the same, written before state was carried (open reads the history) | "
            f"{figures['old_ms']:.1f} ms | {figures['old_vs_alone']:.2f}x | - |",
            "",
            f"{figures['kills']:.0f} kills of each session, in turn, in one supervisor.",
            "",
            "<!-- history-restart-bench:end -->",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-")
    try:
        figures = measure(root, args.epochs, args.kills)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:>18}  {value:.3f}")
    if args.write_docs:
        command = "python -m scripts.store.bench_history_restart"
        if (args.epochs, args.kills) != (100, 20):
            command += f" --epochs {args.epochs} --kills {args.kills}"
        write_section("history-restart-bench", _markdown(figures, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
