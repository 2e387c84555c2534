"""Compare restart latency and the daemon's CPU per control request with an older commit.

    python -m scripts.supervisor.compare_with_commit COMMIT [--rounds N] [--kills N] [--requests N]
        [--pause SECONDS]

Checks COMMIT out into a temporary git worktree and measures, alternating between it
and this tree in the same run (the machines are shared and noisy):
- restart latency: SIGKILL of a worker holding a 10,000-record session to the next
  request answered (``loopd_restart_latency`` of scripts.supervisor.bench_supervisor, relayed
  through the daemon, which both versions serve);
- the daemon's CPU per ``ping`` and per relayed ``send`` on one connection (psutil).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TREE = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") or "git"

PROBE = """
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time
import psutil
try:
    from scripts.supervisor import bench_supervisor as bench
except ModuleNotFoundError:  # a commit from before scripts/ had a folder per room
    sys.path.insert(0, "scripts")
    import bench_supervisor as bench
from supervisor.client import call_with_retry
from worker.ipc.wire import Channel
kills, requests, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
root = tempfile.mkdtemp()
start_daemon = bench.start_daemon
if pause:  # a kill every so often, not one at the heels of the last restart
    big = os.path.join(root, "big")
    bench.make_big_session(big)
    restarted = start_daemon(big, "--stable-after", "0", "--start-method", "fork")
    latencies = []
    bench._poll(lambda: bench._state(big) == "RUNNING")
    for n in range(kills):
        time.sleep(pause)  # the pace of the kills, not a wait for a state
        pid = bench._pid(big)
        began = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        call_with_retry(big, "send", session="big", text=f"after kill {n}", key=f"kill-{n}",
                        deadline=time.monotonic() + 60)
        latencies.append(time.perf_counter() - began)
    bench.stop_daemon(restarted)
else:
    latencies = bench.loopd_restart_latency(root, kills, "fork")
home = os.path.join(root, "cpu")
daemon = start_daemon(home, "--budget", "1000000000")
sock = socket.socket(socket.AF_UNIX)
sock.connect(os.path.join(home, "loopd.sock"))
channel = Channel(sock)
channel.send({"id": 0, "op": "create", "session": "a"})
channel.recv()
proc = psutil.Process(daemon.pid)
cpu = {}
for op in ("ping", "send"):
    before = sum(proc.cpu_times()[:2])
    for n in range(requests):
        channel.send({"id": n, "op": op, "session": "a", "text": "x" * 40, "key": f"{op}{n}"})
        assert channel.recv()["ok"]
    cpu[op] = (sum(proc.cpu_times()[:2]) - before) / requests * 1e6
sock.close()
daemon.send_signal(signal.SIGTERM)
daemon.wait()
shutil.rmtree(root, ignore_errors=True)
print(json.dumps({"restart_ms": statistics.median(latencies) * 1000, "cpu_us": cpu}))
"""


def probe(tree: Path, kills: int, requests: int, pause: float) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(kills), str(requests), str(pause)],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=15)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument(
        "--pause", type=float, default=0.0,
        help="seconds before each kill (0: each at the heels of the last restart)",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-compare-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run([GIT, "worktree", "add", "-q", "--detach", str(old), args.commit],
                       cwd=TREE, check=True)  # fmt: skip
        try:
            for round_no in range(args.rounds):
                for name, tree in ((args.commit[:10], old), ("this tree", TREE)):
                    found = probe(tree, args.kills, args.requests, args.pause)
                    print(f"round {round_no + 1} {name:>10}: {json.dumps(found)}", flush=True)
        finally:
            subprocess.run([GIT, "worktree", "remove", "--force", str(old)], cwd=TREE,
                           check=False)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
