"""Whether a process's threads are stopped, read from ``/proc`` (a SIGSTOP is in effect
only once every thread has taken it: one is woken to take it, the others after it ran)."""

from __future__ import annotations

import os


def thread_states(pid: int) -> dict[int, str]:
    """Each thread of process ``pid`` and its state letter (``/proc/PID/task/TID/stat``);
    FileNotFoundError once the process is reaped."""
    states = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states[int(task)] = stat.read().rpartition(")")[2].split()[0]
        except OSError:
            continue  # the thread ended
    return states


def all_stopped(pid: int) -> bool:
    """True if no thread of ``pid`` can run: each stopped (T), or the process ended."""
    try:
        states = thread_states(pid)
    except FileNotFoundError:
        return True  # reaped
    return set(states.values()) <= {"T", "Z", "X"}
