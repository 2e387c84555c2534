"""Run on the client host of ``scripts.cluster.bench_cluster_scale_hosts``: keyed load, as JSON.

    python -m scripts.cluster.bench_hosts_load ETCD_URL SECONDS SESSION[,SESSION...]

One client process per session (forked), each with its own ``ClusterClient``
(certificates from $LOOPD_TLS_*): a warm-up request, then, from a common start,
keyed requests one at a time to its session for SECONDS, each reply's token checked
by the client. Prints the requests done, the seconds from the common start to the
last process's end, and every request's round trip.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from threading import BrokenBarrierError

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import ClusterError
from supervisor.errors import ControlError

WARMUP = 20
Result = tuple[float, list[float], str | None]
"""A client process's end, its round trips, and what failed, if anything."""
TEXT = "a request of about sixty characters, as a client would send it"


def one_client(url: str, session: str, seconds: float, start: Barrier, out: Queue[Result]) -> None:
    times: list[float] = []
    try:
        with ClusterClient(url, timeout=30) as cluster:
            for n in range(WARMUP):
                cluster.send(session, TEXT, key=f"{session}-warm-{time.time_ns()}-{n}")
            start.wait(timeout=120)
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                began = time.perf_counter()
                cluster.send(session, TEXT, key=f"{session}-{time.time_ns()}-{n}")
                times.append(time.perf_counter() - began)
                n += 1
    except (ClusterError, ControlError, BrokenBarrierError) as exc:  # told in one line
        start.abort()
        out.put((time.monotonic(), times, f"{session}: {type(exc).__name__}: {exc}"))
    else:
        out.put((time.monotonic(), times, None))


def main() -> None:
    url, seconds, sessions = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(",")
    context = multiprocessing.get_context("fork")
    out: Queue[Result] = context.Queue()
    start = context.Barrier(len(sessions) + 1)
    workers = [
        context.Process(target=one_client, args=(url, s, seconds, start, out)) for s in sessions
    ]
    for worker in workers:
        worker.start()
    try:
        start.wait(timeout=180)
        began = time.monotonic()
        results = [out.get(timeout=seconds + 120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join()
    failed = [why for _end, _batch, why in results if why is not None]
    if failed:
        raise SystemExit(f"bench_hosts_load: {failed[0]}")
    times = [t for _end, batch, _why in results for t in batch]
    elapsed = max(end for end, _batch, _why in results) - began
    print(json.dumps({"requests": len(times), "seconds": elapsed, "times": times}))


if __name__ == "__main__":
    main()
