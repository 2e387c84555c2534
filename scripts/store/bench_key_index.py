"""What the key index costs: open, memory, look-ups and commits of a session of many keys.

Run by ``scripts.store.bench_store`` (its figures go in the same section of
docs/benchmarks.md); alone: ``python -m scripts.store.bench_key_index [--epochs N]``.

Every figure compares the session of ``epochs`` x ``per_epoch`` keys with the same
newest epoch alone (a session of one epoch), or with the same session written before
the index existed (open then reads every epoch), measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable

from worker import Baseline, Session, User
from worker.store.format.records import without_checksums
from worker.store.loader import load_session

BASELINE = Baseline(system="bench", memory="", tools=[])
T = "2026-11-29T20:17:57.123456Z"


def make_keyed_session(home: str, epochs: int, per_epoch: int) -> list[float]:
    """A session ``k`` of ``epochs`` epochs of ``per_epoch`` keyed requests; commit times."""
    commits = []
    with Session.create(home, "k", BASELINE) as session:
        for epoch in range(epochs):
            batch = [User(time=T, text="u" * 40, key=f"k-{epoch}-{n}") for n in range(per_epoch)]
            session.append_many(batch)
            if epoch < epochs - 1:
                started = time.perf_counter()
                session.commit_epoch(f"summary {epoch}", BASELINE)
                commits.append(time.perf_counter() - started)
    return commits


def strip_index(directory: str) -> None:
    """Rewrite the session as the store wrote it before the key index and the digest.

    (And before checksums: the lines lose theirs, the SessionStart its binding.)
    """
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.endswith(".keys"):
            os.unlink(path)
            continue
        if not name.endswith(".jsonl"):
            continue
        with open(path, "rb") as f:
            lines = without_checksums(f.read()).splitlines(keepends=True)
        first, last = json.loads(lines[0]), json.loads(lines[-1])
        for field in ("key_index", "prior_log_size", "prior_log_crc", "fence_token", "fence_node"):
            first.pop(field, None)
        last.pop("carried", None)
        lines[0] = json.dumps(first, separators=(",", ":")).encode() + b"\n"
        if len(lines) > 1:
            lines[-1] = json.dumps(last, separators=(",", ":")).encode() + b"\n"
        with open(path, "wb") as f:
            f.write(b"".join(lines))


def _fastest(rounds: int, *runs: Callable[[], float]) -> list[float]:
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for index, run in enumerate(runs):
            times[index].append(run())
    return [min(t) for t in times]


def _opener(home: str) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        Session.open(home, "k").close()
        return time.perf_counter() - started

    return run


def _retained(home: str) -> tuple[int, int]:
    """Bytes of Python memory an open session holds, and the peak while it opened."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    session = Session.open(home, "k")
    held, peak = tracemalloc.get_traced_memory()
    session.close()
    tracemalloc.stop()
    return held - before, peak - before


def _lookups(home: str, keys: list[str]) -> float:
    """Seconds per ``find_key`` of ``keys``."""
    with Session.open(home, "k") as session:
        started = time.perf_counter()
        for key in keys:
            session.find_key(key)
        return (time.perf_counter() - started) / len(keys)


def _one_commit(home: str) -> float:
    with Session.open(home, "k") as session:
        session.append_many(
            [User(time=T, text="u", key=f"next-{session.epoch}-{n}") for n in range(1000)]
        )
        started = time.perf_counter()
        session.commit_epoch("one more", BASELINE)
        return time.perf_counter() - started


def bench_key_index(root: str, epochs: int, per_epoch: int, rounds: int) -> dict[str, object]:
    """The figures of docs/benchmarks.md's key index rows."""
    many = tempfile.mkdtemp(dir=root)
    commits = make_keyed_session(many, epochs, per_epoch)
    alone = tempfile.mkdtemp(dir=root)
    make_keyed_session(alone, 1, per_epoch)
    old = tempfile.mkdtemp(dir=root)
    shutil.copytree(os.path.join(many, "sessions"), os.path.join(old, "sessions"))
    strip_index(os.path.join(old, "sessions", "k"))
    assert load_session(os.path.join(many, "sessions", "k"), "k").first_read == epochs - 1
    t_many, t_alone, t_old = _fastest(rounds, _opener(many), _opener(alone), _opener(old))
    (held_many, peak_many), (held_alone, _peak) = _retained(many), _retained(alone)
    new_keys = [f"new-{n}" for n in range(20_000)]
    miss_many, miss_alone = _lookups(many, new_keys), _lookups(alone, new_keys)
    old_keys = [f"k-{e}-{e % per_epoch}" for e in range(0, epochs - 2, max(1, epochs // 200))]
    hit_old = _lookups(many, old_keys)
    index_bytes = sum(
        os.path.getsize(os.path.join(many, "sessions", "k", n))
        for n in os.listdir(os.path.join(many, "sessions", "k"))
        if n.endswith(".keys")
    )
    commit_many, commit_alone = _one_commit(many), _one_commit(alone)
    return {
        "index_keys": float(epochs * per_epoch),
        "index_epochs": float(epochs),
        "index_open_s": t_many,
        "index_open_vs_alone": t_many / t_alone,
        "index_old_open_s": t_old,
        "index_old_vs_index": t_old / t_many,
        "index_memory_mb": held_many / 1e6,
        "index_memory_alone_mb": held_alone / 1e6,
        "index_memory_peak_mb": peak_many / 1e6,
        "index_bytes_per_key": (held_many - held_alone) / ((epochs - 1) * per_epoch),
        "index_file_mb": index_bytes / 1e6,
        "index_miss_us": miss_many * 1e6,
        "index_miss_vs_alone": miss_many / miss_alone,
        "index_hit_ms": hit_old * 1e3,
        "index_commit_median_ms": statistics.median(commits) * 1e3,
        "index_commit_max_ms": max(commits) * 1e3,
        "index_commit_vs_alone": commit_many / commit_alone,
    }


def markdown_rows(figures: dict[str, object]) -> list[str]:
    """The key index rows of the store section's table."""

    def f(key: str, fmt: str = "{:.2f}") -> str:
        value = figures[key]
        assert isinstance(value, float)
        return fmt.format(value)

    keys = f"{f('index_keys', '{:,.0f}')} keys in {f('index_epochs', '{:,.0f}')} epochs"
    return [
        f"| `Session.open`, {keys} / the same newest epoch alone | "
        f"{f('index_open_vs_alone')}x ({f('index_open_s', '{:.3f}')} s; the same session "
        f"without the key index, which reads every epoch: {f('index_old_vs_index', '{:.0f}')}x "
        f"slower, {f('index_old_open_s', '{:.1f}')} s) | open independent of history |",
        f"| memory of that open session / the newest epoch alone | "
        f"{f('index_memory_mb', '{:.1f}')} MB / {f('index_memory_alone_mb', '{:.1f}')} MB: "
        f"{f('index_bytes_per_key', '{:.1f}')} bytes per sealed key (index files "
        f"{f('index_file_mb', '{:.1f}')} MB; peak while opening "
        f"{f('index_memory_peak_mb', '{:.1f}')} MB) | 16 bytes per key |",
        f"| `find_key` of a new key, {keys} / the newest epoch alone | "
        f"{f('index_miss_vs_alone', '{:.1f}')}x ({f('index_miss_us', '{:.1f}')} us) | "
        f"a few us |",
        f"| `find_key` of a key of a sealed epoch (read back from its log) | "
        f"{f('index_hit_ms', '{:.2f}')} ms | retries only |",
        f"| `commit_epoch` with {keys} / the newest epoch alone | "
        f"{f('index_commit_vs_alone')}x (building it: median "
        f"{f('index_commit_median_ms', '{:.1f}')} ms, slowest "
        f"{f('index_commit_max_ms', '{:.0f}')} ms, a merge of half the keys) | "
        f"amortized O(log epochs) per key |",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--per-epoch", type=int, default=1000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-keys-", dir=args.dir)
    try:
        figures = bench_key_index(root, args.epochs, args.per_epoch, 5)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:>28}  {value:.4f}" if isinstance(value, float) else f"{key:>28}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
