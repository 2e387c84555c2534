"""A small etcd v3 client on the JSON gateway, with ``http.client`` from the standard library.

Unary calls (range, put, delete, txn, lease grant and revoke) share one kept-alive
connection guarded by a lock. Streaming calls (lease keepalive, watch) each open a
connection of their own, read what they need within a deadline, and close it. Every
failure leaves as ``EtcdUnavailable`` (not reached, timed out, connection lost) or
``EtcdRequestFailed`` (etcd answered with an error); nothing is retried here, since
only the caller knows whether its request is safe to repeat.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Final, Literal

from supervisor.cluster.errors import EtcdRequestFailed, EtcdUnavailable
from supervisor.cluster.etcd_types import (
    Compare,
    Delete,
    Get,
    Json,
    KeyValue,
    Lease,
    Operation,
    Put,
    TxnResult,
    WatchEvent,
    as_int,
    encode_key,
    operation_json,
    range_end_of_prefix,
)

__all__ = ["EtcdClient"]

DEFAULT_TIMEOUT: Final = 2.0
"""Seconds a unary call may take, connect included."""
_MAX_REPLY: Final = 64 << 20


class EtcdClient:
    """A client of one etcd endpoint, ``http://host:port``."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
            raise ValueError(f"etcd URL must be http://host:port, got {url!r}")
        self.url = url
        self.timeout = timeout
        self._host = parsed.hostname
        self._port = parsed.port
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        """Close the kept-alive connection (a later call opens a new one)."""
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- key-value --------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """Return ``key``'s key-value, or None when it does not exist."""
        found = self.range(key)
        return found[0] if found else None

    def range(self, key: str, *, prefix: bool = False) -> list[KeyValue]:
        """Return the key-values of ``key`` (or of every key under it when ``prefix``)."""
        reply = self._call("/v3/kv/range", Get(key=key, prefix=prefix).to_json())
        return _kvs(reply)

    def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``value`` at ``key``; return the revision of the write."""
        reply = self._call("/v3/kv/put", Put(key=key, value=value, lease=lease).to_json())
        return _revision(reply)

    def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it when ``prefix``); return how many were."""
        reply = self._call("/v3/kv/deleterange", Delete(key=key, prefix=prefix).to_json())
        return as_int(reply, "deleted")

    def txn(
        self,
        compare: list[Compare],
        success: list[Operation],
        failure: list[Operation] | None = None,
    ) -> TxnResult:
        """Run ``success`` if every compare holds, else ``failure``, atomically."""
        body: Json = {
            "compare": [c.to_json() for c in compare],
            "success": [operation_json(op) for op in success],
            "failure": [operation_json(op) for op in failure or []],
        }
        reply = self._call("/v3/kv/txn", body)
        reads: list[list[KeyValue]] = []
        responses = reply.get("responses", [])
        if not isinstance(responses, list):
            raise EtcdRequestFailed(self.url, -1, "txn reply: responses is not a list")
        for response in responses:
            if isinstance(response, dict) and isinstance(response.get("response_range"), dict):
                reads.append(_kvs(response["response_range"]))
        return TxnResult(
            succeeded=reply.get("succeeded") is True, revision=_revision(reply), reads=reads
        )

    # -- leases -----------------------------------------------------------------------

    def lease_grant(self, ttl: int) -> Lease:
        """Grant a lease of ``ttl`` seconds."""
        reply = self._call("/v3/lease/grant", {"TTL": str(ttl)})
        if reply.get("error"):
            raise EtcdRequestFailed(self.url, -1, f"lease grant: {reply['error']}")
        return Lease(id=as_int(reply, "ID"), ttl=as_int(reply, "TTL"))

    def lease_keepalive(self, lease: int) -> int:
        """Renew ``lease`` once; return its new TTL in seconds, 0 if it has expired."""
        # The gateway streams keepalive replies; one request gets one reply line.
        lines: list[bytes] = []

        def take(line: bytes) -> bool:
            lines.append(line)
            return True

        self._stream(
            "/v3/lease/keepalive", {"ID": str(lease)}, time.monotonic() + self.timeout, take
        )
        if not lines:
            raise EtcdUnavailable(self.url, "lease keepalive: no reply within the timeout")
        return as_int(_result(self.url, lines[0]), "TTL")

    def lease_revoke(self, lease: int) -> None:
        """Revoke ``lease`` now: every key bound to it is deleted."""
        self._call("/v3/lease/revoke", {"ID": str(lease)})

    # -- watch ------------------------------------------------------------------------

    def watch(
        self,
        key: str,
        *,
        start_revision: int,
        prefix: bool = False,
        max_events: int = 1,
        wait: float = DEFAULT_TIMEOUT,
    ) -> list[WatchEvent]:
        """Return the changes of ``key`` from ``start_revision`` on, reading for at most ``wait`` s.

        Stops after ``max_events`` events or at the deadline, whichever comes first: a
        bounded read, never a connection left open.
        """
        request: Json = {"key": encode_key(key), "start_revision": str(start_revision)}
        if prefix:
            request["range_end"] = range_end_of_prefix(key)
        events: list[WatchEvent] = []

        def take(line: bytes) -> bool:
            listed = _result(self.url, line).get("events", [])
            for event in listed if isinstance(listed, list) else []:
                kind: Literal["PUT", "DELETE"] = (
                    "DELETE" if event.get("type") == "DELETE" else "PUT"
                )
                events.append(WatchEvent(kind=kind, kv=KeyValue.from_json(event.get("kv", {}))))
            return len(events) >= max_events

        self._stream("/v3/watch", {"create_request": request}, time.monotonic() + wait, take)
        return events[:max_events]

    # -- transport --------------------------------------------------------------------

    def _call(self, path: str, body: Json) -> Json:
        payload = json.dumps(body).encode("utf-8")
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(
                        self._host, self._port, timeout=self.timeout
                    )
                self._conn.request("POST", path, payload, {"Content-Type": "application/json"})
                response = self._conn.getresponse()
                data = response.read(_MAX_REPLY)
                status = response.status
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                raise EtcdUnavailable(self.url, f"{path}: {exc!r}") from exc
        return _decode_reply(self.url, path, status, data)

    def _stream(
        self, path: str, body: Json, deadline: float, take: Callable[[bytes], bool]
    ) -> None:
        """Feed a streaming reply's JSON lines to ``take`` until it says enough or time is up.

        The connection is this call's own and is closed before returning.
        """
        payload = json.dumps(body).encode("utf-8")
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.request("POST", path, payload, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                _decode_reply(self.url, path, response.status, response.read(_MAX_REPLY))
            while (left := deadline - time.monotonic()) > 0:
                if conn.sock is not None:
                    conn.sock.settimeout(left)
                try:
                    line = response.readline(_MAX_REPLY)
                except TimeoutError:
                    return
                if not line:
                    return
                if line.strip() and take(line):
                    return
        except (OSError, http.client.HTTPException) as exc:
            raise EtcdUnavailable(self.url, f"{path}: {exc!r}") from exc
        finally:
            conn.close()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _decode_reply(url: str, path: str, status: int, data: bytes) -> Json:
    """Decode a gateway reply; EtcdRequestFailed for an error reply or an undecodable one."""
    try:
        reply = json.loads(data)
    except ValueError as exc:
        raise EtcdRequestFailed(url, status, f"{path}: undecodable reply: {exc}") from exc
    if not isinstance(reply, dict):
        raise EtcdRequestFailed(url, status, f"{path}: reply is not a JSON object")
    if status != 200 or ("error" in reply and "code" in reply):
        raise EtcdRequestFailed(url, as_int(reply, "code"), str(reply.get("message", reply)))
    return reply


def _result(url: str, line: bytes) -> Json:
    """Return the ``result`` of one line of a streaming reply."""
    reply = _decode_reply(url, "stream", 200, line)
    result = reply.get("result")
    if not isinstance(result, dict):
        raise EtcdRequestFailed(url, -1, f"stream line without a result: {line[:200]!r}")
    return result


def _revision(reply: Json) -> int:
    header = reply.get("header")
    return as_int(header, "revision") if isinstance(header, dict) else 0


def _kvs(reply: object) -> list[KeyValue]:
    listed = reply.get("kvs", []) if isinstance(reply, dict) else []
    return (
        [KeyValue.from_json(kv) for kv in listed if isinstance(kv, dict)]
        if isinstance(listed, list)
        else []
    )
