"""A spare worker: a child of the supervisor forked before it is needed, prepared as far
as a worker can be without its session, waiting for one.

A restart of a forked worker spends its first milliseconds before the worker's own code
runs: the fork of the supervisor (its page tables), the child's first touches of shared
pages, ``setsid`` (a scheduler autogroup on many kernels). A spare has paid them already:
a worker start takes it, sends it the worker's order and descriptors (the same
``ForkOrder`` a template is sent), and it runs the worker at once, while the supervisor
forks the next spare. Only for the fork start method; one spare at a time.

A spare holds nothing of the supervisor's: it closed every descriptor but its order
socket, and goes by ``loopd-spare`` until it becomes a worker (``loopd:<id>``). It
ends when the socket closes (serve stopped, or died); serve SIGKILLs and reaps it at
its stop. A spare that dies idle is reaped and replaced after a pause; after
``GIVE_UP`` in a row die within ``YOUNG`` seconds of their fork, none is made again (the
workers are forked plainly, as before, and serve's log says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable
from typing import Final, NoReturn

from supervisor.proc_stat import stopped
from supervisor.templates import reaper
from supervisor.templates.order import (
    CHANNEL_FD,
    HEARTBEAT_FD,
    MAX_MESSAGE,
    ORDER_FDS,
    ForkOrder,
    OrderError,
)
from supervisor.templates.prctl import die_with_parent, live_on_parent_death
from supervisor.templates.worker_child import (
    child_main,
    close_all_but,
    flush_std_streams,
    name_process,
    place_descriptors,
    prepare_child,
    run_worker,
)
from worker.store.errors import SessionError
from worker.warm_up import remove_stale_scratch, scratch_home, warm_up

SPARE_NAME: Final = "loopd-spare"
FORKING_NAME: Final = "loopd-forking"
"""What serve's thread goes by while it forks a spare (the child is born with it, then
names itself ``SPARE_NAME``): serve never answers to the spare's name."""
SPARE_NAMES: Final = (SPARE_NAME, FORKING_NAME)
"""The names a spare goes by, never a worker's."""
REFILL_AFTER_DEATH: Final = 1.0
"""Seconds before a spare that died idle is replaced."""
REFILL_AFTER_TAKE: Final = 0.0
"""Seconds before the next spare is forked: at the loop's next turn, so that it is ready
for the next start; its warm-up runs while the worker that took the last one opens its
session (on the other core of two)."""
WARM_UP_REQUESTS: Final = 4
"""Requests of the spare's own warm-up (worker/warm_up.py)."""
READY: Final = b"r"
"""What a spare says, once, when its warm-up is done."""
GIVE_UP: Final = 3
"""Spares in a row that die before they are ready, within ``YOUNG`` seconds of their
fork, before none is made."""
YOUNG: Final = 5.0

Report = Callable[[str], None]


class Spare:
    """One spare: its pid, a pidfd readable at its death, the supervisor's end of its
    order socket."""

    def __init__(self) -> None:
        # Its warm-up's directory is made here and removed here too at its end: a spare
        # SIGKILLed mid-way (at serve's stop, say) cannot remove it itself.
        self.scratch: str | None = None
        with contextlib.suppress(OSError):
            self.scratch = scratch_home()
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:  # out of descriptors: nothing of it left behind
            self._remove_scratch()
            raise
        flush_std_streams()
        serve = os.getpid()
        try:
            pid = _fork_named(FORKING_NAME)
        except BaseException:
            parent.close()
            child.close()
            self._remove_scratch()
            raise
        if pid == 0:
            _be_spare(child.fileno(), self.scratch, serve)
        child.close()
        reaper.claim(pid)  # waited for here, never reaped as a stray
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:  # out of descriptors: no spare, and none left behind
            parent.close()
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            reaper.release(pid)
            self._remove_scratch()
            raise
        self.born = time.monotonic()
        self.ready = False  # it said so once its warm-up was done
        self.pid = pid
        self.sock = parent

    def send(self, order: ForkOrder, fds: list[int]) -> None:
        """Hand the spare its worker's order. OSError if it could not take it: EMSGSIZE,
        an order too large for one datagram (an App's large environment); else it died."""
        socket.send_fds(self.sock, [order.encode()], fds)

    def release(self) -> None:
        """The spare became a worker: its pid is the worker's to watch and reap now."""
        self.sock.close()
        os.close(self.pidfd)

    def end(self) -> None:
        """SIGKILL the idle spare and reap it, and remove what its warm-up left."""
        self.sock.close()
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        reaper.release(self.pid)
        os.close(self.pidfd)
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


class Spares:
    """The supervisor's spare (none without a loop: only serve keeps one)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, report: Report) -> None:
        self.loop = loop
        self.report = report
        self.spare: Spare | None = None
        self.deaths = 0  # spares that died idle since the last one that became a worker
        self.failures = 0  # forks of a spare that failed in a row
        self._refill: asyncio.Handle | None = None
        self.closed = loop is None

    def fill(self) -> None:
        """Fork a spare unless one waits (or spares are off)."""
        self._refill = None
        if self.closed or self.spare is not None or self.loop is None:
            return
        try:
            spare = Spare()
        except OSError as exc:  # out of descriptors or processes for now, or no /proc
            self.failures += 1
            if self.failures >= GIVE_UP:
                self.closed = True
                self.report(f"no spare worker ({exc}; {self.failures} tries in a row); "
                            "workers are forked as they start")  # fmt: skip
            else:
                self._schedule(REFILL_AFTER_DEATH)
            return
        self.failures = 0
        self.spare = spare
        self.loop.add_reader(spare.pidfd, self._died, spare)
        self.loop.add_reader(spare.sock, self._heard, spare)

    def _heard(self, spare: Spare) -> None:
        """The spare says it is ready (or its socket ended: its pidfd tells the rest)."""
        if self.loop is not None:
            self.loop.remove_reader(spare.sock)
        with contextlib.suppress(OSError):
            spare.ready = spare.sock.recv(1) == READY

    def take(self, order: ForkOrder, fds: list[int]) -> int | None:
        """The pid of the spare now running ``order``'s worker with ``fds``; None: no spare
        (fork plainly). Another spare is forked once this start is done."""
        spare = self.spare
        if spare is None or self.loop is None:
            return None
        if stopped(spare.pid):
            # SIGSTOPped (a debugger, a freezer cgroup): it would take the order and run
            # nothing until the start timed out. Killed (SIGKILL ends a stopped process),
            # replaced; this start forks plainly.
            self._forget(spare)
            self._schedule(REFILL_AFTER_DEATH)
            return None
        if not spare.ready:
            self._heard_now(spare)
        if not spare.ready:
            return None  # still warming up: this start forks plainly, the spare waits on
        try:
            spare.send(order, fds)
        except OSError as exc:
            if exc.errno != errno.EMSGSIZE:  # it died (or is dying): fork plainly
                self._forget(spare)
                self._schedule(0.0)
            return None  # EMSGSIZE: this order is too large; the spare waits for the next
        self.spare = None
        self.loop.remove_reader(spare.pidfd)
        spare.release()
        self.deaths = 0
        self._schedule(REFILL_AFTER_TAKE)
        return spare.pid

    def _heard_now(self, spare: Spare) -> None:
        """Take the spare's word if it is in the socket already (its reader not yet run)."""
        try:
            said = spare.sock.recv(1, socket.MSG_DONTWAIT)
        except OSError:
            return
        if self.loop is not None:
            self.loop.remove_reader(spare.sock)
        spare.ready = said == READY

    def close(self) -> None:
        """Serve is ending: end the spare and make no more."""
        self.closed = True
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        spare, self.spare = self.spare, None
        if spare is not None:
            if self.loop is not None and not self.loop.is_closed():
                self.loop.remove_reader(spare.pidfd)
                self.loop.remove_reader(spare.sock)
            spare.end()

    def _forget(self, spare: Spare) -> None:
        self.spare = None
        if self.loop is not None:
            self.loop.remove_reader(spare.pidfd)
            self.loop.remove_reader(spare.sock)
        spare.end()  # reaps it

    def _died(self, spare: Spare) -> None:
        if self.spare is not spare or self.loop is None:
            return
        self._forget(spare)
        # One killed once ready (an operator's kill, the rig's) says nothing of the next:
        # only a spare that dies before its warm-up ends counts towards giving up.
        young = not spare.ready and time.monotonic() - spare.born < YOUNG
        self.deaths = self.deaths + 1 if young else 0
        if self.deaths >= GIVE_UP:
            self.report(
                f"{self.deaths} spare workers in a row died before they were ready; "
                "no more are made, workers are forked as they start"
            )
            return
        self._schedule(REFILL_AFTER_DEATH)

    def schedule_fill(self) -> None:
        self._schedule(0.0)

    def _schedule(self, delay: float) -> None:
        if self.closed or self._refill is not None or self.loop is None:
            return
        if delay:
            self._refill = self.loop.call_later(delay, self.fill)
        else:
            self._refill = self.loop.call_soon(self.fill)


_SPARES: list[Spares] = []


def open_spares(loop: asyncio.AbstractEventLoop, report: Report) -> Spares:
    """Keep a spare worker from now on (serve's start, the fork start method)."""
    close_spares()
    with contextlib.suppress(OSError):
        remove_stale_scratch()  # of a serve SIGKILLed with its spare (docs/templates.md)
    spares = Spares(loop, report)
    _SPARES[:] = [spares]
    # Forked once the loop runs, after the rest of serve's start: what it sets up for
    # its workers (the descriptor limit that --http raises) is the spare's too.
    spares.schedule_fill()
    return spares


def close_spares() -> None:
    """End the spare, if any; none is made after (serve is ending)."""
    if _SPARES:
        _SPARES.pop().close()


def take_spare(order: ForkOrder, fds: list[int]) -> int | None:
    """The pid of a spare now running ``order``'s worker; None if serve keeps none."""
    return _SPARES[0].take(order, fds) if _SPARES else None


def _fork_named(name: str) -> int:
    """Fork a child that goes by ``name`` from its first instant (a child inherits the
    forking thread's name): never taken for a worker by one who lists serve's children
    and reads their names, as a spare that named itself a moment later would be. This
    thread goes by it for the length of the fork."""
    comm = os.open("/proc/thread-self/comm", os.O_RDWR | os.O_CLOEXEC)
    try:
        own = os.read(comm, 64).rstrip(b"\n")
        os.write(comm, name[:15].encode())  # each write of the file names it whole
        pid = -1
        try:
            pid = os.fork()
        finally:
            if pid != 0:  # the parent, or a fork that failed: its own name back
                os.write(comm, own)
        return pid
    finally:
        os.close(comm)


def _be_spare(order_fd: int, scratch: str | None, serve: int) -> NoReturn:
    """The spare's whole life: prepare, warm up, wait for an order, become its worker."""
    child_main(functools.partial(_spare_life, order_fd, scratch, serve))


def _spare_life(order_fd: int, scratch: str | None, serve: int) -> int:
    name_process(SPARE_NAME)  # first: it was born with serve's forking name
    # SIGKILLed with serve, even stopped (SIGSTOP: it would never see its socket's end);
    # a worker it becomes outlives serve, as any worker, to finish its batch.
    die_with_parent()
    if os.getppid() != serve:
        return 0  # serve died before that was armed
    prepare_child()
    close_all_but(order_fd)
    _warm(order_fd, scratch)
    order, fds = _await_order(order_fd)
    if order is None:
        return 0  # the supervisor closed its end: it stopped, or died
    live_on_parent_death()
    output = place_descriptors(fds)
    return run_worker(order, CHANNEL_FD, HEARTBEAT_FD, output, on_path=False)


def _warm(order_fd: int, scratch: str | None) -> None:
    """Run the worker's code once here, then say so. The pages a worker's first request
    writes (the allocator's, the code's) are then the spare's own already: a forked
    child's first open of a 10,000-record session took 8.1-9.3 ms, 6.9 ms after this
    (docs/benchmarks.md). A warm-up that fails costs only that gain."""
    with contextlib.suppress(OSError, SessionError):
        warm_up(WARM_UP_REQUESTS, scratch)
    with contextlib.suppress(OSError):
        os.write(order_fd, READY)


def _await_order(order_fd: int) -> tuple[ForkOrder | None, list[int]]:
    """The order and its descriptors; (None, []) at the end of the socket. The socket is
    closed either way (its number may be where a descriptor goes)."""
    sock = socket.socket(fileno=order_fd)
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, ORDER_FDS)
    finally:
        sock.close()
    if not data:
        return None, []
    if len(fds) not in (2, 3):
        raise OrderError(f"an order carries 2 or 3 descriptors, this one {len(fds)}")
    return ForkOrder.decode(data), fds
