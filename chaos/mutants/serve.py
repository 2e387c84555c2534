"""Mutants of the supervisor, patched into a real ``loopd serve`` (chaos/run/mutant_serve.py)
before it starts: what it forks (its templates and their workers) inherits the patch.

They are scored by the supervisor-level runs (``chaos.run.supervised``,
``chaos.run.catch_up``), not by the store's cases.
"""

from __future__ import annotations

import math
import os
import socket
from typing import NoReturn

from supervisor.templates.order import AppIdentity, ForkOrder


def template_worker_keeps_template_channel() -> None:
    from supervisor.templates import template_main, worker_child  # noqa: PLC0415 - serve only

    become_worker = worker_child.become_worker  # template_main's, by import
    close_all_but = worker_child.close_all_but
    run_template = template_main.run_template
    channel: list[int] = []

    def run_template_noting_channel(
        sock: socket.socket, identity: AppIdentity, parent: int
    ) -> NoReturn:
        channel.append(sock.fileno())
        run_template(sock, identity, parent)

    def become_worker_keeping(
        order: ForkOrder, channel_fd: int, beat_fd: int, output_fd: int | None, *, on_path: bool
    ) -> NoReturn:
        # The bug: a worker forked by a template keeps the template's own channel (the
        # template closed every other descriptor already, so what its workers inherit
        # was taken for theirs). Every worker of one template then holds that socket.
        worker_child.close_all_but = lambda *keep: close_all_but(*keep, *channel)
        become_worker(order, channel_fd, beat_fd, output_fd, on_path=on_path)

    template_main.run_template = run_template_noting_channel
    template_main.become_worker = become_worker_keeping  # type: ignore[attr-defined]


def spare_worker_keeps_what_it_inherited() -> None:
    from supervisor.templates import spare, worker_child  # noqa: PLC0415 - serve only

    close_all_but = worker_child.close_all_but
    run_worker = worker_child.run_worker
    inherited: list[int] = []

    def keep_all(*_keep: int) -> None:
        # The bug: the spare closes nothing of what it inherited from serve (its control
        # socket, the workers' channels of that moment) and its worker keeps it all.
        inherited[:] = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]

    def run_worker_keeping(
        order: ForkOrder, channel_fd: int, beat_fd: int, output_fd: int | None, *, on_path: bool
    ) -> int:
        worker_child.close_all_but = lambda *keep: close_all_but(*keep, *inherited)
        return run_worker(order, channel_fd, beat_fd, output_fd, on_path=on_path)

    spare.close_all_but = keep_all  # type: ignore[attr-defined]
    spare.run_worker = run_worker_keeping  # type: ignore[attr-defined]


def catch_up_in_name_order() -> None:
    from supervisor.scheduling import timers  # noqa: PLC0415 - patched in serve only

    def catch_up_order(catch_up: list[tuple[float, str]]) -> list[str]:
        # The bug: the overdue sessions are woken in the order of their files (by name),
        # not the earliest due first; each is still delivered once, none early.
        overdue = sorted(s for when, s in catch_up if when != math.inf)
        return [*overdue, *(s for when, s in sorted(catch_up) if when == math.inf)]

    timers.catch_up_order = catch_up_order


def identity_by_wall_clock() -> None:
    import psutil  # noqa: PLC0415 - patched in serve only

    from supervisor.sessions import spawn  # noqa: PLC0415 - patched in serve only

    def start_ticks(pid: int) -> float | None:
        # The bug: a worker told apart from a later process of its pid by psutil's
        # create_time(), which adds the boot time as the wall clock says it at each call:
        # after a step of the clock no worker is the process serve started.
        try:
            return float(psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    spawn.start_ticks = start_ticks  # type: ignore[assignment,attr-defined]
