"""Time one append + fdatasync against several of them started together on one disk.

    python -m scripts.bench_disk_fsyncs [--dir DIR] [--writes N] [--rounds R] [--stagger US]

A replicated write on one machine makes three fdatasyncs at once (the owner's and two
followers', each of its own file) where an unreplicated one makes one. This measures
what the disk itself asks for that: threads (an fdatasync lets go of the interpreter's
lock) each appending a 240-byte line to a file of its own and fdatasyncing it, started
together at each write by a barrier; the figure of a write is the time until the
slowest of them returned, its median over N writes, for 1, 2 and 3 files in turn, R
rounds. DIR (default: a new directory under the system's temporary one) must be on the
disk to measure.

``--stagger US`` (repeatable) also times three files with the second and third started
US µs after the first, as a follower's copy is: its step reaches it over the network
after the owner's own write, so its fdatasync starts after the owner's, not with it.
Against one file alone plus that delay (what three disks of their own would take) the
difference is what sharing one disk adds to a replicated write, with no CPU in it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

LINE = b"x" * 239 + b"\n"


def together(directory: str, files: int, writes: int, stagger: float = 0.0) -> float:
    """Median seconds until the slowest of ``files`` appends + fdatasyncs returned, all
    but the first started ``stagger`` seconds after it (a busy wait: no sleep is that
    exact)."""
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
            elif stagger:
                due = time.perf_counter() + stagger
                while time.perf_counter() < due:
                    pass
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
    parser.add_argument("--stagger", type=float, action="append", default=[],
                        help="µs the second and third files start after the first")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-fsyncs-", dir=args.dir) as directory:
        for _ in range(args.rounds):
            figures = {files: together(directory, files, args.writes) for files in (1, 2, 3)}
            line = "  ".join(f"{files} at once: {seconds * 1e6:4.0f} µs"
                             for files, seconds in figures.items())  # fmt: skip
            for us in args.stagger:
                late = together(directory, 3, args.writes, us / 1e6)
                extra = late - figures[1] - us / 1e6  # past what disks of their own would take
                line += (f"  3, two {us:g} µs late: {late * 1e6:4.0f} µs ({late / figures[1]:.2f}x "
                         f"one; {extra * 1e6:+.0f} µs past one + {us:g})")  # fmt: skip
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
