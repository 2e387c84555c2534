"""A fake etcd on loopback: a proxy to a real etcd that can answer with a bad reply instead.

``FakeEtcd(upstream)`` forwards every gateway request to the real etcd at ``upstream``
(``None``: nothing to forward to). ``answer(reply, paths)`` makes it answer the
requests of ``paths`` (every path when empty) with ``reply`` instead, until
``forward()`` (with ``after_forwarding``, it forwards first, so etcd applies the
request whose reply is lost): an HTTP 503 "leader changed" as etcd answers during an
election, a body that is not JSON, a lease reply whose TTL is not an integer, or a reply
dripped one byte at a time. It runs in threads of the test process, on its own port.
"""

from __future__ import annotations

import http.client
import http.server
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Final

from tests.harness.etcd_server import free_port

LEASE_PATHS: Final = frozenset({"/v3/lease/grant", "/v3/lease/keepalive"})
STREAMING: Final = frozenset({"/v3/lease/keepalive", "/v3/watch"})
UPSTREAM_TIMEOUT: Final = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BadReply:
    """What the fake answers instead of forwarding: a status and a body, maybe dripped."""

    status: int
    body: bytes
    chunked: bool = False  # as the gateway streams a keepalive's reply
    drip_every: float = 0.0  # seconds between two bytes of the whole reply (0: all at once)


LEADER_CHANGED: Final = BadReply(
    status=503,
    body=b'{"error":"etcdserver: leader changed","code":14,"message":"etcdserver: leader changed"}',
)
NOT_JSON: Final = BadReply(status=200, body=b"<html><body>502 Bad Gateway</body></html>\n")
TTL_NOT_INTEGER: Final = BadReply(
    status=200,
    body=b'{"result":{"header":{"revision":"9"},"ID":"7","TTL":"soon"},'
    b'"header":{"revision":"9"},"ID":"7","TTL":"soon"}\n',
    chunked=True,
)


def dripping(every: float) -> BadReply:
    """A well-formed reply sent one byte every ``every`` seconds, headers included."""
    return BadReply(status=200, body=b'{"header":{"revision":"1"},"kvs":[]}' + b" " * 64,
                    drip_every=every)  # fmt: skip


class FakeEtcd:
    """The fake's server: ``url`` to point a node at, ``answer``/``forward`` to steer it."""

    def __init__(self, upstream: str | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.upstream = urllib.parse.urlsplit(upstream) if upstream is not None else None
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._reply: BadReply | None = None
        self._paths: frozenset[str] = frozenset()
        self._after_forwarding = False
        self.answered: dict[str, int] = {}  # path -> bad replies sent
        handler = type("Handler", (_Handler,), {"fake": self})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-etcd")
        self._thread.start()

    def answer(
        self,
        reply: BadReply,
        paths: frozenset[str] = frozenset(),
        *,
        after_forwarding: bool = False,
    ) -> None:
        """Answer the requests of ``paths`` (all when empty) with ``reply`` from now on."""
        with self._lock:
            self._reply, self._paths, self._after_forwarding = reply, paths, after_forwarding

    def forward(self) -> None:
        """Forward every request to the real etcd again."""
        with self._lock:
            self._reply = None

    def bad_reply_for(self, path: str) -> tuple[BadReply | None, bool]:
        """The bad reply for a request of ``path`` (None: forward it), and if it goes first."""
        with self._lock:
            if self._reply is None or (self._paths and path not in self._paths):
                return None, False
            self.answered[path] = self.answered.get(path, 0) + 1
            return self._reply, self._after_forwarding

    def close(self) -> None:
        """Stop serving: drips end at their next byte, the serving thread is joined."""
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


class _Handler(http.server.BaseHTTPRequestHandler):
    fake: FakeEtcd
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test's output is its assertions."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.close_connection = True
        bad, forward_first = self.fake.bad_reply_for(self.path)
        try:
            if bad is not None:
                if forward_first:
                    self._forward(body, reply=False)
                self._send_bad(bad)
            elif self.fake.upstream is None:
                self._send_bad(LEADER_CHANGED)
            else:
                self._forward(body)
        except OSError:
            return  # the client gave up (its deadline): nothing left to answer

    def _send_bad(self, bad: BadReply) -> None:
        payload = (
            f"{len(bad.body):x}\r\n".encode() + bad.body + b"\r\n0\r\n\r\n"
            if bad.chunked
            else bad.body
        )
        framing = "Transfer-Encoding: chunked" if bad.chunked else f"Content-Length: {len(payload)}"
        reason = "OK" if bad.status == 200 else "Service Unavailable"
        head = (
            f"HTTP/1.1 {bad.status} {reason}\r\nContent-Type: application/json\r\n"
            f"{framing}\r\nConnection: close\r\n\r\n"
        ).encode()
        whole = head + payload
        if bad.drip_every <= 0:
            self.wfile.write(whole)
            return
        for index in range(len(whole)):
            if self.fake.stopping.wait(bad.drip_every):  # the fake's pace, not a wait for a state
                return
            self.wfile.write(whole[index : index + 1])
            self.wfile.flush()

    def _forward(self, body: bytes, *, reply: bool = True) -> None:
        upstream = self.fake.upstream
        assert upstream is not None
        assert upstream.hostname is not None
        conn = http.client.HTTPConnection(
            upstream.hostname, upstream.port, timeout=UPSTREAM_TIMEOUT
        )
        try:
            conn.request("POST", self.path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if not reply:
                response.read()
                return
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            if self.path in STREAMING and response.status == 200:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while line := response.readline():
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            else:
                data = response.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
        finally:
            conn.close()
