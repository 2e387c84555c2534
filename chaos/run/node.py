"""The rig as the daemon of one worker, for the real ``supervisor.client.Client``.

A fresh worker process (forked, the mutant applied, no boundary hook) is started as the
daemon starts it, on a control channel the rig holds; a client's connection is handed
to it as the daemon hands one over (``attach``, the descriptor by SCM_RIGHTS), so the
client the users run (supervisor/client/direct.py), its outcomes, its reconnects and
its retries by key are what talk to the worker. Only ``Client._connect`` (asking the
daemon for a connection) is the rig's.
"""

from __future__ import annotations

import contextlib
import os
import socket
from types import TracebackType

from chaos import mutants
from chaos.lifeline import die_with_parent
from chaos.run.child import worker_child
from chaos.scenarios.scenarios import Scenario
from supervisor.client.direct import Client
from supervisor.errors import ControlError
from worker.ipc.wire import Channel, Message, encode
from worker.store.disk import durable


class Node:
    """One worker of the session at ``home``, started fresh; ``client()`` talks to it."""

    def __init__(
        self,
        home: str,
        scenario: Scenario,
        mutant: str | None,
        *,
        flags: list[str] | None = None,
        output: str = os.devnull,
    ) -> None:
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            code = 1
            try:
                die_with_parent(parent)  # a kill of the rig ends it too
                ours.close()
                sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(sink, 1)
                os.dup2(sink, 2)
                mutants.apply(mutant)
                durable.set_hook(None)
                code = worker_child(os.path.abspath(home), scenario, theirs.fileno(),
                                    create=False, node=flags)  # fmt: skip
            finally:
                os._exit(code)
        theirs.close()
        self.pid: int | None = pid
        self.code: int | None = None
        self.control = Channel(ours)
        self.ready: Message | None = None
        self.exiting: Message | None = None
        self._clients: list[Client] = []
        while self.ready is None and self.exiting is None:
            message = self.control.recv()
            if message is None:
                break
            if message.get("op") == "ready":
                self.ready = message
            elif message.get("op") == "exiting":
                self.exiting = message

    def attach(self) -> socket.socket:
        """A new client connection to the worker, handed over as the daemon does."""
        if self.ready is None:
            raise ControlError("unavailable", f"the worker did not start: {self.exiting}")
        client_end, worker_end = socket.socketpair()
        try:
            socket.send_fds(self.control.sock, [encode({"op": "attach"})], [worker_end.fileno()])
        except OSError as exc:
            client_end.close()
            raise ControlError("closed", f"the worker is gone: {exc}") from exc
        finally:
            worker_end.close()
        return client_end

    def client(self) -> Client:
        """A new client (closed with the node)."""
        client = NodeClient(self)
        self._clients.append(client)
        return client

    def stop(self) -> int:
        """Stop the worker (as the daemon does) and reap it; its exit code."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.pid is not None:
            with contextlib.suppress(OSError):  # it exited already
                self.control.send({"id": 0, "op": "stop"})
            while self.control.recv() is not None:
                pass
            self.control.close()
            _pid, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
            self.pid = None
        assert self.code is not None
        return self.code

    def __enter__(self) -> Node:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class NodeClient(Client):
    """The real client; its connection to the worker comes from the rig, not a daemon."""

    def __init__(self, node: Node) -> None:
        super().__init__(os.devnull, timeout=30.0, retry_for=5.0)
        self.node = node

    def _connect(self, session: str) -> socket.socket:
        del session
        return self.node.attach()
