"""Benchmark the session store against raw OS loops in the same run; print ratios.

    python -m scripts.store.bench_store [--dir D] [--quick] [--write-docs]

(the key index figures come from ``scripts.store.bench_key_index``, run from here)

Every figure is a ratio against a reference measured side by side, in alternating
rounds, on the same disk: the machines are shared and noisy, so absolute times alone
say little. ``--write-docs`` replaces the store section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import filesystem_of, machine_line
from scripts.store.bench_key_index import bench_key_index, markdown_rows, strip_index
from worker import Assistant, Baseline, Session, SessionStart, ToolResult, Usage, User
from worker.store import session as session_module
from worker.store.disk import durable
from worker.store.disk.scan_file import forget_summary, read_summary
from worker.store.format.records import Record, encode_record, without_checksums

BASELINE = Baseline(system="bench", memory="", tools=[])
RECORD = Assistant(time="2026-11-29T20:17:57.123456Z", text="x" * 80)
LINE = encode_record(RECORD)


def _fastest_of(rounds: int, *runs: Callable[[], float]) -> list[float]:
    """Run each function ``rounds`` times, interleaved; return each one's fastest time.

    The minimum is the run least disturbed by other work on a shared machine.
    """
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for index, run in enumerate(runs):
            times[index].append(run())
    return [min(t) for t in times]


def bench_append(root: str, count: int, rounds: int) -> dict[str, float]:
    """Alternate blocks of raw, single, grouped and seam-only appends on open files."""
    raw_path = os.path.join(root, "raw.log")
    seam_path = os.path.join(root, "seam.log")
    raw_fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    seam_fd = os.open(seam_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    single = Session.create(os.path.join(root, "single"), "b", BASELINE)
    grouped = Session.create(os.path.join(root, "grouped"), "b", BASELINE)
    batch = [RECORD] * 64
    block = max(count // rounds, 1)

    def raw() -> float:
        start = time.perf_counter()
        for _ in range(block):
            os.write(raw_fd, LINE)
            os.fdatasync(raw_fd)
        return time.perf_counter() - start

    def append() -> float:
        start = time.perf_counter()
        for _ in range(block):
            single.append(RECORD)
        return time.perf_counter() - start

    def append_many() -> float:
        batches = max(block // 8, 1)
        start = time.perf_counter()
        for _ in range(batches):
            grouped.append_many(batch)
        return (time.perf_counter() - start) / (batches * 64) * block

    def seam() -> float:
        # The durable module's own calls with no hook set, on the same bytes: what the
        # boundary seam adds to a raw write+fdatasync (an upper bound on the hook's cost).
        start = time.perf_counter()
        for _ in range(block):
            durable.write_all(seam_fd, LINE, seam_path)
            durable.fdatasync(seam_fd, seam_path)
        return time.perf_counter() - start

    assert durable.set_hook(None) is None
    try:
        totals = [0.0, 0.0, 0.0, 0.0]
        for _ in range(rounds):
            for index, run in enumerate((raw, append, append_many, seam)):
                totals[index] += run()
    finally:
        os.close(raw_fd)
        os.close(seam_fd)
        single.close()
        grouped.close()
    t_raw, t_single, t_group, t_seam = totals
    done = block * rounds
    return {
        "raw_per_s": done / t_raw,
        "append_per_s": done / t_single,
        "append_many_per_record_per_s": done / t_group,
        "append_vs_raw": t_raw / t_single,
        "append_many_vs_append": t_single / t_group,
        "hook_unset_cost_of_append": max(0.0, t_seam - t_raw) / t_single,
    }


def _make_session(home: str, records: int) -> str:
    batch: list[Record] = []
    call = 0
    with Session.create(home, "big", BASELINE) as session:
        for n in range(records - 1):
            kind = n % 4
            if kind == 0:
                batch.append(User(text=f"request {n} " + "u" * 40, key=f"k{n}"))
            elif kind == 1:
                call += 1
                batch.append(ToolResult(call=call, tool="echo", output="o" * 60, ok=True))
            elif kind == 2:
                batch.append(Assistant(text="a" * 80))
            else:
                batch.append(Usage(prompt_tokens=n, completion_tokens=10, context_tokens=n + 10))
            if len(batch) == 1000:
                session.append_many(batch)
                batch = []
        session.append_many(batch)
        return session.log_path


def bench_open(root: str, sizes: list[int], rounds: int) -> dict[str, object]:
    results: dict[str, object] = {}
    per_record: dict[int, float] = {}
    bare_per_record: dict[int, float] = {}
    for size in sizes:
        home = tempfile.mkdtemp(dir=root)
        log = _make_session(home, size)

        def bare(log: str = log) -> float:
            start = time.perf_counter()
            with open(log, "rb") as f:
                for line in f.read().split(b"\n")[:-1]:
                    json.loads(line)
            return time.perf_counter() - start

        def store(home: str = home) -> float:
            forget_summary(home, "big")  # the open of a log not opened before: a whole scan
            start = time.perf_counter()
            Session.open(home, "big").close()
            return time.perf_counter() - start

        def reopen(home: str = home) -> float:
            if read_summary(home, "big") is None:  # the summary an earlier open kept
                Session.open(home, "big").close()
            start = time.perf_counter()
            Session.open(home, "big").close()
            return time.perf_counter() - start

        t_bare, t_store, t_reopen = _fastest_of(rounds, bare, store, reopen)
        results[f"reopen_{size}_s"] = t_reopen
        results[f"reopen_{size}_vs_bare"] = t_reopen / t_bare
        per_record[size] = t_store / size
        bare_per_record[size] = t_bare / size
        results[f"open_{size}_s"] = t_store
        results[f"open_{size}_vs_bare"] = t_store / t_bare
        shutil.rmtree(home)
    smallest, largest = min(sizes), max(sizes)
    results["open_per_record_growth"] = per_record[largest] / per_record[smallest]
    results["bare_per_record_growth"] = bare_per_record[largest] / bare_per_record[smallest]
    return results


def _make_history(home: str, name: str, epochs: int, per_epoch: int) -> str:
    """A session of ``epochs`` epochs of ``per_epoch`` records each; return its directory."""
    with Session.create(home, name, BASELINE) as session:
        for epoch in range(epochs):
            batch: list[Record] = []
            for n in range(per_epoch - 1 - (epoch > 0)):
                if n % 2:
                    batch.append(Assistant(text="a" * 80))
                else:
                    batch.append(User(text="u" * 40, key=f"{name}-{epoch}-{n}"))
            session.append_many(batch)
            if epoch < epochs - 1:
                session.commit_epoch(f"summary {epoch}", BASELINE)
        return session.dir


def _strip_carried(directory: str) -> None:
    """Rewrite every SessionStart as a writer from before carried state would have."""
    strip_index(directory)
    for name in os.listdir(directory):
        if not name.endswith(".jsonl") or name == "0.jsonl":
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            first, rest = without_checksums(f.read()).split(b"\n", 1)
        start = json.loads(first)
        for block in SessionStart.OPTIONAL:
            for key in block:
                start.pop(key, None)
        with open(path, "wb") as f:
            f.write(json.dumps(start, separators=(",", ":")).encode() + b"\n" + rest)


def bench_history(root: str, epochs: int, per_epoch: int, rounds: int) -> dict[str, object]:
    """Open with a long history vs two epochs and the same current epoch alone (issue 32:
    open of 100 epochs <= 1.2x open of 2 epochs)."""
    alone = tempfile.mkdtemp(dir=root)
    _make_history(alone, "big", 1, per_epoch)
    two = tempfile.mkdtemp(dir=root)
    _make_history(two, "big", 2, per_epoch)
    long = tempfile.mkdtemp(dir=root)
    _make_history(long, "big", epochs, per_epoch)
    old = tempfile.mkdtemp(dir=root)
    shutil.copytree(os.path.join(long, "sessions"), os.path.join(old, "sessions"))
    _strip_carried(os.path.join(old, "sessions", "big"))

    def opener(home: str) -> Callable[[], float]:
        def run() -> float:
            forget_summary(home, "big")  # the newest epoch scanned whole, as before summaries
            start = time.perf_counter()
            Session.open(home, "big").close()
            return time.perf_counter() - start

        return run

    t_alone, t_two, t_long, t_old = _fastest_of(
        rounds, opener(alone), opener(two), opener(long), opener(old)
    )
    return {
        "history_epochs": float(epochs),
        "history_alone_s": t_alone,
        "history_two_s": t_two,
        "history_long_vs_two": t_long / t_two,
        "history_long_vs_alone": t_long / t_alone,
        "history_old_format_vs_alone": t_old / t_alone,
    }


def bench_open_durability(root: str, records: int, rounds: int) -> dict[str, object]:
    """What open's fsync of everything it read costs: open vs the same open without it."""
    home = tempfile.mkdtemp(dir=root)
    _make_session(home, records)
    real = session_module._make_durable

    def with_sync() -> float:
        start = time.perf_counter()
        Session.open(home, "big").close()
        return time.perf_counter() - start

    def without_sync() -> float:
        session_module._make_durable = lambda state, log_fd: None
        try:
            start = time.perf_counter()
            Session.open(home, "big").close()
            return time.perf_counter() - start
        finally:
            session_module._make_durable = real

    t_with, t_without = _fastest_of(rounds, with_sync, without_sync)
    return {
        "open_sync_records": float(records),
        "open_sync_s": t_with - t_without,
        "open_sync_vs_open": t_with / t_without,
    }


def _markdown(figures: dict[str, object], command: str) -> str:
    def f(key: str, fmt: str = "{:.2f}") -> str:
        value = figures[key]
        assert isinstance(value, float)
        return fmt.format(value)

    return "\n".join(
        [
            "<!-- store-bench:start -->",
            "## Session store",
            "",
            f"Command: `{command}`  ",
            f"{machine_line()}; files on {figures['fs']}.",
            "",
            "| measure | figure | goal |",
            "|---|---|---|",
            f"| single `append` rate / raw `os.write`+`os.fdatasync` loop | "
            f"{f('append_vs_raw')}x ({f('append_per_s', '{:.0f}')}/s vs "
            f"{f('raw_per_s', '{:.0f}')}/s) | >= 0.9x |",
            f"| `append_many` of 64, per record / single `append` | "
            f"{f('append_many_vs_append', '{:.1f}')}x | >= 20x |",
            f"| `Session.open` of 100,000 records / bare read + `json.loads` loop | "
            f"{f('open_100000_vs_bare')}x ({f('open_100000_s', '{:.3f}')} s) | <= 1.0x |",
            f"| the same, opened again (a restart: its scan summary, docs/format.md) / the "
            f"bare loop | {f('reopen_100000_vs_bare')}x ({f('reopen_100000_s', '{:.4f}')} s) "
            "| - |",
            f"| `Session.open` time per record, 100k / 1k | "
            f"{f('open_per_record_growth')}x (the bare loop: "
            f"{f('bare_per_record_growth')}x) | ~1 (linear) |",
            f"| boundary seam with no hook, share of `append` time | "
            f"{float(str(figures['hook_unset_cost_of_append'])) * 100:.2f}% | <= 2% |",
            f"| `Session.open`, {f('history_epochs', '{:.0f}')} epochs of 1,000 records / "
            f"2 epochs ({f('history_two_s', '{:.4f}')} s) | {f('history_long_vs_two')}x "
            f"(/ the current epoch alone, {f('history_alone_s', '{:.4f}')} s: "
            f"{f('history_long_vs_alone')}x; written before state was carried: "
            f"{f('history_old_format_vs_alone', '{:.1f}')}x) | <= 1.2x |",
            f"| `Session.open` of {f('open_sync_records', '{:,.0f}')} records, with / "
            f"without its fsync of what it read | {f('open_sync_vs_open')}x "
            f"(+{float(str(figures['open_sync_s'])) * 1000:.1f} ms) | restart within 10% |",
            *markdown_rows(figures),
            "",
            "<!-- store-bench:end -->",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and records")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-", dir=args.dir)
    try:
        rounds = 3 if args.quick else 7
        figures: dict[str, object] = {}
        figures.update(bench_append(root, 2000 if args.quick else 20_000, 40))
        sizes = [1000, 10_000, 100_000]
        figures.update(bench_open(root, sizes, rounds))
        figures.update(bench_history(root, 20 if args.quick else 100, 1000, rounds))
        figures.update(bench_open_durability(root, 10_000, rounds))
        figures.update(bench_key_index(root, 100 if args.quick else 1000, 1000, 3))
        figures["fs"] = filesystem_of(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:>32}  {value:.4f}" if isinstance(value, float) else f"{key:>32}  {value}")
    if args.write_docs:
        command = "python -m scripts.store.bench_store" + (" --quick" if args.quick else "")
        write_section("store-bench", _markdown(figures, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
