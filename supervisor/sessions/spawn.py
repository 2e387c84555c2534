"""Spawning a worker process, watching it through a pidfd, and signalling it safely."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import psutil

from supervisor.proc_stat import start_ticks, stat_fields
from supervisor.templates import reaper
from supervisor.templates.order import CHANNEL_FD, HEARTBEAT_FD, AppIdentity, ForkOrder
from supervisor.templates.pool import templates
from supervisor.templates.spare import take_spare
from supervisor.templates.worker_child import become_worker, flush_std_streams
from worker.app import DEFAULT_APP
from worker.ipc.heartbeat import HeartbeatCell
from worker.process import STORE_ENV
from worker.store.errors import SessionError
from worker.warm_up import warm_up

if TYPE_CHECKING:
    from supervisor.node.serving import WorkerCluster

_GONE: Final = frozenset({errno.ESRCH})
_PF_EXITING: Final = 0x4
"""The kernel's flag of a process that has begun to exit (include/linux/sched.h), in the
flags word of /proc/PID/stat (proc(5))."""


class StartMethod(enum.Enum):
    """How a worker process comes to be (one interface, two methods, as multiprocessing has).

    EXEC starts a fresh interpreter (``python -m worker``): nothing is inherited but the
    channel. FORK forks the already warm, single-threaded supervisor and runs the worker
    in the child: no interpreter start-up and no imports, so restarts are several times
    faster; the child closes every inherited descriptor but its channel and the standard
    streams, and never returns into supervisor code. TEMPLATE forks the worker from its
    App's template, a child of the supervisor that imported the App once
    (supervisor/templates/, docs/templates.md); until that template is ready, as FORK.
    AUTO, the default, is TEMPLATE for every App but loopd's built-in default App and FORK
    for that one: the supervisor imported and warmed it (worker/warm_up.py), so the
    supervisor is that App's template already, one round trip closer.
    """

    EXEC = "exec"
    FORK = "fork"
    TEMPLATE = "template"
    AUTO = "auto"

    def for_app(self, app: str | None) -> StartMethod:
        """How a worker of ``app`` (module:attribute; None: the default App) is started."""
        if self is StartMethod.AUTO:
            return StartMethod.FORK if is_default_app(app) else StartMethod.TEMPLATE
        return self


def is_default_app(app: str | None) -> bool:
    """``app`` is loopd's built-in default App (``--app`` unset, or naming it)."""
    return (app or DEFAULT_APP) == DEFAULT_APP


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """How to start a session's worker."""

    home: str
    session: str
    create: bool = False
    slot: int = 0
    app: str | None = None
    budget: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    """The worker's working directory (None: the supervisor's)."""
    path: tuple[str, ...] = ()
    """Directories put first on the worker's import path (exec: through PYTHONPATH)."""
    start_method: StartMethod = StartMethod.FORK
    capture_output: bool = False
    """Give the worker one pipe for stdout and stderr, read by the supervisor (``output``)."""
    heartbeat: float | None = None
    request_deadline: float | None = None
    hang_timeout: float | None = None
    max_batch: int | None = None
    poisoned: tuple[tuple[bytes, int], ...] = ()
    """Key digests of requests that were in flight at too many deaths (refused)."""
    cluster: WorkerCluster | None = None  # cluster mode: token and lease (docs/scaling.md)
    store: str | None = None
    """The libpq URI of the database holding the session (None: its home). It reaches the
    worker in its environment (STORE_ENV), never its arguments; the worker connects."""

    def opened(self) -> WorkerSpec:
        """Once created, a session is only ever opened: a vanished directory must not
        reappear."""
        return dataclasses.replace(self, create=False) if self.create else self

    def environment(self) -> dict[str, str]:
        """What the worker's environment gets beyond the supervisor's: the App's, the store."""
        return {**self.extra_env, **({STORE_ENV: self.store} if self.store else {})}

    def argv(self, channel_fd: int, heartbeat_fd: int | None = None) -> list[str]:
        argv = [
            sys.executable, "-m", "worker",
            "--home", self.home, "--session", self.session, "--channel-fd", str(channel_fd),
        ]  # fmt: skip
        if self.create:
            argv += ["--create", "--slot", str(self.slot)]
        if self.app is not None:
            argv += ["--app", self.app]
        if self.budget is not None:
            argv += ["--budget", str(self.budget)]
        if self.heartbeat is not None:
            argv += ["--heartbeat", repr(self.heartbeat)]
        if heartbeat_fd is not None:
            argv += ["--heartbeat-fd", str(heartbeat_fd)]
        if self.request_deadline is not None:
            argv += ["--request-deadline", repr(self.request_deadline)]
        if self.hang_timeout is not None:
            argv += ["--hang-timeout", repr(self.hang_timeout)]
        if self.max_batch is not None:
            argv += ["--max-batch", str(self.max_batch)]
        for digest, deaths in self.poisoned:
            argv += ["--poison", f"{digest.hex()}:{deaths}"]
        if self.cluster is not None:
            argv += self.cluster.argv()
        return argv


class WorkerProcess:
    """A running worker: its pid, a pidfd that becomes readable at its death, its channel.

    ``sock`` is the supervisor's end of the channel; the loop's transport owns and
    closes it.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        """Start the worker without a shell, in its own process group."""
        self.heartbeat, beat_fd = HeartbeatCell.create()
        self._popen: subprocess.Popen[bytes] | None = None
        # The output pipe's read end is the supervisor's (``output``); the write end is
        # the worker's stdout and stderr, and is closed here once the worker holds it.
        self.output: int | None = None
        output_w: int | None = None
        parent = child = None
        method = spec.start_method.for_app(spec.app)
        try:  # every descriptor made here is closed on every way out (out of them: EMFILE)
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            if spec.capture_output:
                self.output, output_w = os.pipe2(os.O_CLOEXEC)
            if method is StartMethod.EXEC:
                self._popen = subprocess.Popen(
                    spec.argv(child.fileno(), beat_fd),
                    pass_fds=(child.fileno(), beat_fd),
                    stdin=subprocess.DEVNULL,
                    stdout=output_w,
                    stderr=output_w,
                    start_new_session=True,  # its own process group, for killpg
                    env=_exec_env(spec),
                    cwd=spec.cwd,
                )
                self.pid = self._popen.pid
            elif method is StartMethod.TEMPLATE:
                self.pid = _from_template(spec, child.fileno(), beat_fd, output_w) or (
                    _fork_worker(spec, child.fileno(), beat_fd, output_w)
                )
            else:
                self.pid = _from_spare(spec, child.fileno(), beat_fd, output_w) or (
                    _fork_worker(spec, child.fileno(), beat_fd, output_w)
                )
        except BaseException:
            self._close_own(parent)
            raise
        finally:
            if child is not None:
                child.close()
            os.close(beat_fd)  # the mapping stays; the worker has its own descriptor
            if output_w is not None:
                os.close(output_w)
        reaper.claim(self.pid)  # waited for here, never reaped as a stray (a subreaper's)
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:  # out of descriptors once it runs: it is ended, nothing kept
            for kill in (os.killpg, os.kill):  # its group, once it has made one
                with contextlib.suppress(OSError):
                    kill(self.pid, signal.SIGKILL)
            if self._popen is not None:
                self._popen.wait()  # our child: reaped here
            reaper.release(self.pid)  # a forked one is reaped as a stray from now on
            self._close_own(parent)
            raise
        # None: already gone (the pidfd reports its exit)
        self.started_ticks: int | None = start_ticks(self.pid)
        parent.setblocking(False)
        self.sock = parent
        self.returncode: int | None = None

    def _close_own(self, parent: socket.socket | None) -> None:
        """Close what the supervisor keeps of a worker that did not start."""
        if parent is not None:
            parent.close()
        self.heartbeat.close()
        if self.output is not None:
            os.close(self.output)

    def is_same_process(self) -> bool:
        """True if ``pid`` still names the process we started (its start since boot)."""
        if self.returncode is not None or self.started_ticks is None:
            return False
        return start_ticks(self.pid) == self.started_ticks

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the worker's process group after checking its identity."""
        if not self.is_same_process():
            return False
        try:
            os.killpg(self.pid, signum)
        except OSError as exc:
            if exc.errno in _GONE:
                return False
            raise
        return True

    def kill(self) -> bool:
        """SIGKILL the worker's group (identity checked)."""
        return self.signal_group(signal.SIGKILL)

    def reap(self) -> int:
        """Collect the exit status (call when the pidfd is readable); return the code.

        Negative for a death by signal, as subprocess reports it. First SIGKILLs what is
        left of its process group (what its App forked): until it is reaped, the dead
        worker's pid still names its group and cannot have been reused.
        """
        with contextlib.suppress(ProcessLookupError):  # none: it died before its setsid
            os.killpg(self.pid, signal.SIGKILL)
        if self._popen is not None:
            self.returncode = self._popen.wait()
        else:
            _pid, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        reaper.release(self.pid)
        reaper.reap_strays()  # what its App left behind and the kill above ended, if ours
        return self.returncode

    def exiting(self) -> bool:
        """The worker has begun to exit (killed, or its App ended it), though its pidfd and
        its channel may not say so yet; False if that cannot be read.

        A dying process's descriptors are released highest number first, and the pidfd
        fires only after the last one: a client whose direct connection was numbered above
        the channel sees its end first and asks again for a connection while the channel
        still takes one (the descriptor handed over dies with the worker, the request
        sent on it unread). The flag is set before any descriptor is released.
        """
        if self.returncode is not None:
            return True
        fields = stat_fields(self.pid)
        if fields is None:
            return False  # no /proc to ask: hand over as before
        # From the third field: state, ppid, pgrp, session, tty_nr, tpgid, flags.
        return len(fields) > 6 and bool(int(fields[6]) & _PF_EXITING)

    def in_request(self) -> bool:
        """The worker is applying a batch of requests now (its heartbeat cell says)."""
        return self.heartbeat.busy_since() is not None

    def last_batch_ended(self) -> float | None:
        """When the worker's last batch of requests ended (its heartbeat cell says)."""
        return self.heartbeat.idle_since()

    def rss_bytes(self) -> int | None:
        """The worker's resident set size, if it is alive."""
        if not self.is_same_process():
            return None
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            return None

    def cpu_seconds(self) -> float | None:
        """The worker's CPU time so far (user + system), if it is alive."""
        if not self.is_same_process():
            return None
        try:
            times = psutil.Process(self.pid).cpu_times()
        except psutil.NoSuchProcess:
            return None
        return round(times.user + times.system, 3)

    def close(self) -> None:
        """Release the pidfd and the heartbeat cell (the channel's socket belongs to the
        loop's transport)."""
        os.close(self.pidfd)
        self.heartbeat.close()


def prepare_forks(method: StartMethod) -> str | None:
    """Before the first fork: run the worker's code once here (worker/warm_up.py), so the
    pages that running it writes are written in the supervisor and shared by every
    worker forked afterwards. Nothing for exec. Returns why it was skipped, if it was
    (the workers start the same either way, only with less memory shared)."""
    if method is StartMethod.EXEC:
        return None
    try:
        warm_up()
    except (OSError, SessionError) as exc:
        return f"the workers' warm-up was skipped ({exc}); each forked worker shares less memory"
    return None


def _fork_worker(spec: WorkerSpec, channel_fd: int, beat_fd: int, output_fd: int | None) -> int:
    """Fork; in the child, become the worker and exit with its code. Return the child pid."""
    flush_std_streams()
    pid = os.fork()
    if pid:
        return pid
    become_worker(_order(spec, channel_fd, beat_fd), channel_fd, beat_fd, output_fd, on_path=False)


def _order(spec: WorkerSpec, channel_fd: int, beat_fd: int) -> ForkOrder:
    return ForkOrder(
        session=spec.session,
        argv=tuple(spec.argv(channel_fd, beat_fd)[3:]),
        env=spec.environment(),
        cwd=spec.cwd,
        path=spec.path,
    )


def _from_spare(
    spec: WorkerSpec, channel_fd: int, beat_fd: int, output_fd: int | None
) -> int | None:
    """The pid of the spare worker now running ``spec``'s worker; None: serve has none."""
    fds = [channel_fd, beat_fd, *([output_fd] if output_fd is not None else [])]
    return take_spare(_order(spec, CHANNEL_FD, HEARTBEAT_FD), fds)


def _from_template(
    spec: WorkerSpec, channel_fd: int, beat_fd: int, output_fd: int | None
) -> int | None:
    """The pid of the worker its App's template forked; None: none is ready (fork plainly)."""
    fds = [channel_fd, beat_fd, *([output_fd] if output_fd is not None else [])]
    order = _order(spec, CHANNEL_FD, HEARTBEAT_FD)
    return templates().fork_worker(app_identity(spec), order, fds)


def app_identity(spec: WorkerSpec) -> AppIdentity:
    """The template a worker of ``spec`` is forked from: its App and where it imports it."""
    env = {k: v for k, v in spec.extra_env.items() if k != STORE_ENV}
    return AppIdentity(
        app=spec.app or DEFAULT_APP, path=spec.path, cwd=spec.cwd, env=tuple(sorted(env.items()))
    )


def _exec_env(spec: WorkerSpec) -> dict[str, str]:
    """A fresh interpreter's environment: the supervisor's, the App's, its import path."""
    env = {k: v for k, v in os.environ.items() if k != STORE_ENV}
    env.update(spec.environment())
    if spec.path:
        inherited = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([*spec.path, *([inherited] if inherited else [])])
    return env


def describe_exit(code: int) -> str:
    if code == -signal.SIGALRM:
        return "killed by SIGALRM: a request ran past --request-deadline"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
