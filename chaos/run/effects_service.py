"""The rig's effects service: a small HTTP server, a process of the rig, for one worker's life.

Forked from the rig right before a worker of a user's App (``chaos.run.worker_run``), it
outlives that worker's SIGKILL (it is the rig's, not the worker's) and is stopped once
the worker is reaped, after it answered every connection already queued; it dies with
the rig (``die_with_parent``). What it applied is in the case's journal
(``chaos.oracle.effects``), which the next worker's service reads first, so that a key applied
before a crash is not applied again after it, as a real service remembers.

An effect is any ``POST``, ``PUT``, ``PATCH`` or ``DELETE`` under its URL; its kind is
the path (``/notes``: ``notes``), its key the ``Idempotency-Key`` header. A new effect is
answered ``201 {"id": N, "kind": ...}``, a key applied before ``200`` with that same
answer. Before each connection it reads what the rig sent the worker since (a line per
message, on a pipe written before the message is sent): the request in flight is the
one the App was handling when it sent the effect.
"""

from __future__ import annotations

import gc
import http.server
import json
import os
import select
import selectors
import signal
import socket
import socketserver
import sys
import traceback
from dataclasses import dataclass, field
from typing import Final

from chaos.lifeline import die_with_parent
from chaos.oracle.effects import BODY_KEPT, KEY_HEADER, Effect, journal_path, read_journal
from worker.ipc.wire import Message

MAX_BODY: Final = 1 << 20
CONNECTION_TIMEOUT: Final = 5.0  # a connection of a worker killed mid-request ends sooner
STOP_TIMEOUT: Final = 2 * CONNECTION_TIMEOUT
_EFFECT_METHODS: Final = ("POST", "PUT", "PATCH", "DELETE")


class EffectsServiceFailed(RuntimeError):
    """The rig's own effects service failed (a fault of the rig, not of the App)."""

    def __init__(self, pid: int, why: str) -> None:
        super().__init__(pid, why)
        self.pid, self.why = pid, why

    def __str__(self) -> str:
        return f"the rig's effects service (pid {self.pid}) {self.why}"


class EffectsService:
    """The rig's side of one service: its URL, what the worker is sent, the stop."""

    def __init__(self, *, pid: int, port: int, marks: int) -> None:
        self.pid = pid
        self.url = f"http://127.0.0.1:{port}"
        self._marks = marks

    @classmethod
    def start(cls, home: str) -> EffectsService:
        """Fork the service for the next worker of the case whose home is ``home``."""
        # Listening before the fork: a worker that connects at once is queued, not refused.
        listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        marks_r, marks_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the service: never returns
            code = 1
            try:
                die_with_parent(parent)  # a kill of the rig ends it too
                gc.disable()  # a short-lived child: no collection, fewer copied pages
                os.close(marks_w)
                code = _serve(listener, marks_r, journal_path(home))
            except BaseException:  # noqa: BLE001 - the child's main: the rig gets its exit code
                traceback.print_exc(file=sys.stderr)
            finally:
                os._exit(code)
        os.close(marks_r)
        port = int(listener.getsockname()[1])
        listener.close()
        return cls(pid=pid, port=port, marks=marks_w)

    def close_in_worker(self) -> None:
        """In the worker's child: drop the rig's end of the marks pipe, so that a process
        the App leaves behind cannot keep the service from seeing its end."""
        os.close(self._marks)

    def sent(self, message: Message) -> None:
        """The rig sends ``message`` to the worker next (called before it is sent)."""
        request = message.get("request") if message.get("op") == "request" else None
        key = request.get("key") if isinstance(request, dict) else None
        line = json.dumps({"request": key if isinstance(key, str) else None}).encode()
        try:
            os.write(self._marks, line + b"\n")  # a line is below PIPE_BUF: written whole
        except BrokenPipeError:
            return  # the service died: stop() says so

    def stop(self) -> None:
        """End the service once it answered what was queued; raise if it failed."""
        os.close(self._marks)  # its end of stream: answer the backlog, then exit
        pidfd = os.pidfd_open(self.pid)
        try:
            ended, _, _ = select.select([pidfd], [], [], STOP_TIMEOUT)
        finally:
            os.close(pidfd)
        if not ended:
            os.kill(self.pid, signal.SIGKILL)
        _pid, status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if not ended:
            raise EffectsServiceFailed(self.pid, f"did not stop within {STOP_TIMEOUT} s")
        if code != 0:
            raise EffectsServiceFailed(self.pid, f"exited with {code}")


@dataclass(slots=True)
class _Ledger:
    """What the service knows: the keys applied in this case, the request in flight."""

    path: str
    worker: int
    answers: dict[tuple[str, str], Effect] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    attempt: int = 0
    request: str | None = None
    fd: int = -1  # the journal, opened at the first effect: no effect, no file

    @classmethod
    def load(cls, path: str) -> _Ledger:
        effects = read_journal(path)
        ledger = cls(path=path, worker=1 + max((e.worker for e in effects), default=0))
        for effect in effects:
            if effect.applied:
                ledger.counts[effect.kind] = max(ledger.counts.get(effect.kind, 0), effect.number)
                if effect.key is not None:
                    ledger.answers[(effect.kind, effect.key)] = effect
        return ledger

    def mark(self, line: bytes) -> None:
        request = json.loads(line).get("request")
        self.request = request if isinstance(request, str) else None
        if self.request is not None:
            self.attempt += 1

    def receive(self, kind: str, key: str | None, body: bytes) -> Effect:
        """Apply the effect unless its key was; journal it before it is answered."""
        first = self.answers.get((kind, key)) if key is not None else None
        if first is None:
            self.counts[kind] = self.counts.get(kind, 0) + 1
        effect = Effect(
            worker=self.worker,
            attempt=self.attempt if self.request is not None else 0,
            request=self.request,
            kind=kind,
            key=key,
            applied=first is None,
            number=self.counts[kind] if first is None else first.number,
            body=body[:BODY_KEPT].decode("utf-8", "replace"),
        )
        if first is None and key is not None:
            self.answers[(kind, key)] = effect
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        data = effect.to_line()
        while data:  # whole, before the answer: the rig reads it once this process ended
            data = data[os.write(self.fd, data) :]
        return effect


def _serve(listener: socket.socket, marks_fd: int, journal: str) -> int:
    """Answer effects until the rig closes the marks pipe, then answer the backlog."""
    ledger = _Ledger.load(journal)
    os.set_blocking(marks_fd, False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(marks_fd, selectors.EVENT_READ)
    pending = b""
    open_marks = True
    while open_marks:
        ready = {key.fileobj for key, _ in selector.select()}
        # The marks first, always: one written before a request was sent is in the
        # pipe before any connection the App made while handling that request.
        pending, open_marks = _read_marks(marks_fd, pending, ledger)
        if listener in ready:
            _answer(listener.accept()[0], ledger)
    listener.setblocking(False)
    while True:  # what the worker sent before it ended is queued: answer it too
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return 0
        _answer(connection, ledger)


def _read_marks(fd: int, pending: bytes, ledger: _Ledger) -> tuple[bytes, bool]:
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return pending, True
        if not data:
            return pending, False
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            ledger.mark(line)


class _Host(socketserver.BaseServer):
    """What a request handler is given as its server: here, the ledger (one process, one
    connection at a time: no thread, no socket of its own)."""

    def __init__(self, ledger: _Ledger) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ledger = ledger


def _answer(connection: socket.socket, ledger: _Ledger) -> None:
    connection.setblocking(True)
    try:
        _Handler(connection, ("127.0.0.1", 0), _Host(ledger))
    except OSError:
        pass  # the worker died mid-request: what it did not finish sending was not received
    finally:
        connection.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection: each effect on it is journaled, then answered."""

    server: _Host
    timeout = CONNECTION_TIMEOUT  # HTTP/1.0: one effect per connection, then it closes

    def log_message(self, format: str, *args: object) -> None:
        return None  # quiet: the rig reads the journal, not the service's output

    def do_GET(self) -> None:
        self._reply(405, {"error": f"only {', '.join(_EFFECT_METHODS)} are effects"})

    def _effect(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"error": f"body over {MAX_BODY} bytes"})
            return
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            return  # cut short: not received, as a real service would not apply it
        kind = self.path.split("?", 1)[0].strip("/") or "-"
        key = self.headers.get(KEY_HEADER) or None
        effect = self.server.ledger.receive(kind, key, body)
        self._reply(201 if effect.applied else 200, {"id": effect.number, "kind": kind})

    do_POST = do_PUT = do_PATCH = do_DELETE = _effect

    def _reply(self, status: int, document: dict[str, object]) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
