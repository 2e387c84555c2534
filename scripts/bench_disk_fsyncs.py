"""Time one append + fdatasync against several of them started together on one disk.

    python -m scripts.bench_disk_fsyncs [--dir DIR] [--writes N] [--rounds R]

A replicated write on one machine makes three fdatasyncs at once (the owner's and two
followers', each of its own file) where an unreplicated one makes one. This measures
what the disk itself asks for that: threads (an fdatasync lets go of the interpreter's
lock) each appending a 240-byte line to a file of its own and fdatasyncing it, started
together at each write by a barrier; the figure of a write is the time until the
slowest of them returned, its median over N writes, for 1, 2 and 3 files in turn, R
rounds. DIR (default: a new directory under the system's temporary one) must be on the
disk to measure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

LINE = b"x" * 239 + b"\n"


def together(directory: str, files: int, writes: int) -> float:
    """Median seconds until the slowest of ``files`` appends + fdatasyncs returned."""
    fds = [
        os.open(os.path.join(directory, f"f{files}-{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for i in range(files)
    ]
    barrier = threading.Barrier(files)
    started = [0.0] * writes
    ended = [[0.0] * writes for _ in range(files)]

    def run(i: int) -> None:
        for n in range(writes):
            barrier.wait()
            if i == 0:
                started[n] = time.perf_counter()
            os.write(fds[i], LINE)
            os.fdatasync(fds[i])
            ended[i][n] = time.perf_counter()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(files)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for fd in fds:
            os.close(fd)
    return statistics.median(max(ended[i][n] for i in range(files)) - started[n]
                             for n in range(writes))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="a directory on the disk to measure")
    parser.add_argument("--writes", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-fsyncs-", dir=args.dir) as directory:
        for _ in range(args.rounds):
            figures = {files: together(directory, files, args.writes) for files in (1, 2, 3)}
            print("  ".join(f"{files} at once: {seconds * 1e6:4.0f} µs"
                            for files, seconds in figures.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
