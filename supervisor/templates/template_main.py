"""The template process: import one App, then fork its workers on order, until told to end.

It is forked from the warm supervisor, so it starts with the worker's code imported and
warmed (worker/warm_up.py); it adds the App's import, once. Each order is a double fork:
an intermediate child forks the worker and exits at once, so the worker is orphaned and
reparented to the supervisor (a subreaper, prctl.py), which waits for it and sees its
real exit status. The worker's pid is said only after the intermediate is reaped: by
then the worker is the supervisor's child already (a zombie one if it died at once).

The template is single-threaded when it forks: an App whose import started a thread is
refused (THREADS) rather than forked with a lock some thread held. So is one whose import
left a descriptor open or a process running (HOLDS): the workers' own descriptors are put
at their numbers over whatever the template held, so a log file the App opened at import
would be written into a worker's channel or its session's log, and a child the App
started would outlive serve. The workers of a refused App are forked from the
supervisor and import it themselves, each with its own.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Final, NoReturn

from supervisor.templates.order import (
    CHANNEL_FD,
    HEARTBEAT_FD,
    MAX_MESSAGE,
    ORDER_FDS,
    AppIdentity,
    ForkOrder,
    OrderError,
    Said,
    SaidKind,
)
from supervisor.templates.prctl import die_with_parent
from supervisor.templates.watched_files import (
    Fingerprint,
    ImportReads,
    files_clock_ns,
    first_changed,
    printable,
    recording_reads,
    watched_files,
)
from supervisor.templates.worker_child import (
    become_worker,
    close_all_but,
    flush_std_streams,
    name_process,
    place_descriptors,
)
from worker.process import STORE_ENV, bounded

PROCESS_NAME: Final = "loopd-template"


def run_template(sock: socket.socket, identity: AppIdentity, parent: int) -> NoReturn:
    """The forked template's whole life; ``parent`` is the supervisor's pid."""
    code = 0
    try:
        _become_template(sock, identity, parent)
        before = set(sys.modules)
        held = _open_descriptors()
        began = files_clock_ns()
        reads = ImportReads()
        said = _import_app(identity, held, reads)
        sock.send(said.encode())
        if said.kind is SaidKind.READY:
            _take_orders(sock, watched_files(set(sys.modules) - before, reads, began))
        else:
            code = 1
    except BaseException:  # noqa: BLE001 - nothing may unwind into the supervisor's code
        traceback.print_exc()
        code = 1
    finally:
        flush_std_streams()
        os._exit(code)


def _become_template(sock: socket.socket, identity: AppIdentity, parent: int) -> None:
    os.setsid()  # out of the supervisor's group: a terminal's Ctrl-C is the supervisor's
    name_process(PROCESS_NAME)
    die_with_parent()
    if os.getppid() != parent:  # the supervisor died before the line above took effect
        os._exit(0)
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    gc.freeze()  # the supervisor's objects own descriptors closed below: never finalized
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    close_all_but(sock.fileno())  # stdout and stderr stay the supervisor's output
    os.environ.pop(STORE_ENV, None)  # each order brings the store; the template holds none
    os.environ.update(dict(identity.env))
    if identity.cwd is not None:
        os.chdir(identity.cwd)
    extra = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    sys.path[:0] = [*identity.path, *extra]


def _import_app(identity: AppIdentity, held: set[int], reads: ImportReads) -> Said:
    """Import the module and resolve the factory (not called: that is the worker's);
    ``held``: the descriptors open before the import; ``reads`` gets the files it opened."""
    module_name, _, attribute = identity.app.partition(":")
    try:
        with recording_reads(reads):
            target: object = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure is the App's
        return Said(kind=SaidKind.FAILED, text=bounded(f"{type(exc).__name__}: {exc}"))
    threads = _other_threads()
    if threads:
        return Said(kind=SaidKind.THREADS, text=", ".join(threads))
    left = _left_open(held) + _left_running()
    if left:
        return Said(kind=SaidKind.HOLDS, text=bounded(", ".join(left)))
    return Said(kind=SaidKind.READY, text=reads.past_bound())


def _open_descriptors() -> set[int]:
    """The descriptors this process holds (not the listing's own, closed once listed)."""
    return {fd for fd in map(int, os.listdir("/proc/self/fd")) if _target(fd) is not None}


def _target(fd: int) -> str | None:
    """What ``fd`` is open on; None if it is closed."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _left_open(held: set[int]) -> list[str]:
    """The descriptors opened since ``held`` was taken, each with what it is."""
    return [f"descriptor {fd} ({_target(fd)})" for fd in sorted(_open_descriptors() - held)]


def _left_running() -> list[str]:
    """This process's children (the App's import started them), SIGKILLed: the template
    is refused and ends, and they must not outlive it (serve reaps them, as subreaper)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as listed:
            children += [int(pid) for pid in listed.read().split()]
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"process {pid}" for pid in sorted(children)]


def _other_threads() -> list[str]:
    """Threads besides this one, C threads included (/proc counts every task)."""
    names = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        tasks = 1
    unnamed = tasks - 1 - len(names)
    return names + [f"{unnamed} thread(s) not started by threading"] * (unnamed > 0)


def _take_orders(sock: socket.socket, files: dict[str, Fingerprint]) -> None:
    while True:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, ORDER_FDS)
        if not data:
            return  # the supervisor closed its end, or died: the template ends
        # Each worker runs the App's code and data as they are on disk now, as one that
        # imports it itself does: a template whose App changed forks nothing more (one
        # stat a watched file, watched_files.py).
        changed = first_changed(files)
        try:
            if changed is not None:
                said = Said(kind=SaidKind.STALE, text=printable(changed))
            else:
                said = _fork(ForkOrder.decode(data), fds)
        except (OSError, OrderError) as exc:
            said = Said(kind=SaidKind.FORK_FAILED, text=str(exc))
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(said.encode())
        if changed is not None:
            return


def _fork(order: ForkOrder, fds: list[int]) -> Said:
    """Double fork: the worker is the intermediate's child, reparented at its exit."""
    if len(fds) not in (2, 3):
        raise OrderError(f"an order carries 2 or 3 descriptors, this one {len(fds)}")
    flush_std_streams()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        middle = os.fork()
        if middle == 0:
            _intermediate(order, fds, write_end)
        os.close(write_end)
        write_end = -1
        data = b""
        while chunk := os.read(read_end, 16):
            data += chunk
        _pid, status = os.waitpid(middle, 0)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise OSError(f"the intermediate child failed to fork the worker (status {status})")
    return Said(kind=SaidKind.FORKED, pid=int(data.decode()))


def _intermediate(order: ForkOrder, fds: list[int], write_end: int) -> NoReturn:
    code = 1
    try:
        worker = os.fork()
        if worker == 0:
            os.close(write_end)
            _worker(order, fds)
        os.write(write_end, str(worker).encode())
        code = 0
    finally:
        os._exit(code)


def _worker(order: ForkOrder, fds: list[int]) -> NoReturn:
    """Put the descriptors where the order's argv says, then become the worker."""
    output = place_descriptors(fds)
    become_worker(order, CHANNEL_FD, HEARTBEAT_FD, output, on_path=True)
