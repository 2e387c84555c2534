"""Spawning a worker process, watching it through a pidfd, and signalling it safely."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Final

import psutil

from worker.wire import Channel

_GONE: Final = frozenset({errno.ESRCH})


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

    def argv(self, channel_fd: int) -> list[str]:
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
        return argv


class WorkerProcess:
    """A running worker: its pid, a pidfd that becomes readable at its death, its channel."""

    def __init__(self, spec: WorkerSpec) -> None:
        """Start the worker without a shell, in its own process group."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = {**os.environ, **spec.extra_env}
            self.popen = subprocess.Popen(
                spec.argv(child.fileno()),
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, for killpg
                env=env,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid = self.popen.pid
        self.pidfd = os.pidfd_open(self.pid)
        try:
            self.create_time: float | None = psutil.Process(self.pid).create_time()
        except psutil.NoSuchProcess:
            self.create_time = None  # already gone; the pidfd reports its exit
        self.channel = Channel(parent)
        self.returncode: int | None = None

    def is_same_process(self) -> bool:
        """True if ``pid`` still names the process we started (psutil create time)."""
        if self.returncode is not None or self.create_time is None:
            return False
        try:
            return bool(psutil.Process(self.pid).create_time() == self.create_time)
        except psutil.NoSuchProcess:
            return False

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
        """Collect the exit status (call when the pidfd is readable); return the code."""
        self.returncode = self.popen.wait()
        return self.returncode

    def rss_bytes(self) -> int | None:
        """The worker's resident set size, if it is alive."""
        if not self.is_same_process():
            return None
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            return None

    def close(self) -> None:
        """Release the pidfd and the channel."""
        os.close(self.pidfd)
        self.channel.close()
