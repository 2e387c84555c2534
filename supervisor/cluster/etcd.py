"""A small etcd v3 client on the JSON gateway, over the standard library's sockets.

Every call, unary (range, put, delete, txn, lease grant and revoke) or streaming
(lease keepalive, watch), opens a connection of its own and ends by one total deadline
(``timeout``, connect included; ``gateway_http``): an etcd that answers slowly, byte
by byte, or not at all holds the caller for ``timeout`` at most. Every failure leaves
as ``EtcdUnavailable`` (not reached, timed out, connection lost, not HTTP) or
``EtcdRequestFailed`` (etcd answered with an error, or with a reply that is not what
the gateway sends: not JSON, a field of the wrong type); nothing else escapes, and
nothing is retried here, since only the caller knows whether its request is safe to
repeat.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, Literal, TypeVar

from supervisor.cluster.errors import EtcdRequestFailed, EtcdUnavailable, EtcdUnreached
from supervisor.cluster.etcd_endpoints import parse_endpoints
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
from supervisor.cluster.gateway_http import post

__all__ = ["EtcdClient"]

DEFAULT_TIMEOUT: Final = 2.0
"""Seconds a call may take in all, connect included."""
T = TypeVar("T")


class EtcdClient:
    """A client of an etcd cluster: one endpoint or several, ``http://`` or ``https://``.

    ``url`` is one endpoint or a comma-separated list (``https://a:2379,https://b:2379``).
    A call goes to the endpoint that answered last; when no connection to it can be
    made (refused, unreachable, no TLS handshake: nothing was sent) it goes to the next,
    each given a fair share of what is left of the call's deadline. A request that was
    sent and not answered is never sent again here (the caller knows if it may be).
    ``tls``: the client certificate and CA for ``https://`` endpoints (etcd's
    ``--client-cert-auth``); its server certificate must name the host or address used.
    """

    def __init__(
        self, url: str, *, timeout: float = DEFAULT_TIMEOUT, tls: ssl.SSLContext | None = None
    ) -> None:
        self.endpoints = parse_endpoints(url)
        if not timeout > 0 or timeout == float("inf"):
            raise ValueError(f"etcd timeout must be a positive number of seconds, got {timeout!r}")
        if tls is None and any(e.scheme == "https" for e in self.endpoints):
            raise ValueError(f"etcd at {url[:200]!r} is https: give --tls-ca, --tls-cert and "
                             "--tls-key")  # fmt: skip
        self.url = url
        self.timeout = timeout
        self.tls = tls
        self._preferred = 0  # the endpoint that answered last

    def close(self) -> None:
        """Nothing to close: each call's connection is closed when the call ends."""

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
        return self._call("/v3/kv/range", Get(key=key, prefix=prefix).to_json(), _kvs)

    def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``value`` at ``key``; return the revision of the write."""
        return self._call("/v3/kv/put", Put(key=key, value=value, lease=lease).to_json(), _revision)

    def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it when ``prefix``); return how many were."""
        body = Delete(key=key, prefix=prefix).to_json()
        return self._call("/v3/kv/deleterange", body, lambda reply: as_int(reply, "deleted"))

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
        return self._call("/v3/kv/txn", body, _txn_result)

    # -- leases -----------------------------------------------------------------------

    def lease_grant(self, ttl: int) -> Lease:
        """Grant a lease of ``ttl`` seconds."""
        return self._call("/v3/lease/grant", {"TTL": str(ttl)}, _lease)

    def lease_keepalive(self, lease: int) -> int:
        """Renew ``lease`` once; return its new TTL in seconds, 0 if it has expired."""
        # The gateway streams keepalive replies; one request gets one reply line.
        lines: list[bytes] = []

        def take(line: bytes) -> bool:
            lines.append(line)
            return True

        path = "/v3/lease/keepalive"
        self._stream(path, {"ID": str(lease)}, self.timeout, take)
        if not lines:
            raise EtcdUnavailable(self.url, f"{path}: no reply within {self.timeout:g} s")
        with _reading(self.url, path):
            return as_int(_result(self.url, lines[0]), "TTL")

    def lease_revoke(self, lease: int) -> None:
        """Revoke ``lease`` now: every key bound to it is deleted."""
        self._call("/v3/lease/revoke", {"ID": str(lease)}, lambda _reply: None)

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
            with _reading(self.url, "/v3/watch"):
                events.extend(_events(_result(self.url, line)))
            return len(events) >= max_events

        self._stream("/v3/watch", {"create_request": request}, wait, take)
        return events[:max_events]

    # -- transport --------------------------------------------------------------------

    def _call(self, path: str, body: Json, decode: Callable[[Json], T]) -> T:
        """One unary call: the reply decoded by ``decode``, all within the timeout."""
        payload = json.dumps(body).encode("utf-8")
        url, (status, data) = self._post(path, payload, self.timeout, None)
        reply = _decode_reply(url, path, status, data)
        with _reading(url, path):
            return decode(reply)

    def _stream(self, path: str, body: Json, seconds: float, take: Callable[[bytes], bool]) -> None:
        """Feed a streaming reply's JSON lines to ``take`` until it says enough or time is up."""
        payload = json.dumps(body).encode("utf-8")
        url, (status, data) = self._post(path, payload, seconds, take)
        if status != 200:
            _decode_reply(url, path, status, data)  # raises: an error reply
            raise EtcdRequestFailed(url, -1, f"{path}: HTTP {status}")

    def _post(
        self, path: str, payload: bytes, seconds: float, take: Callable[[bytes], bool] | None
    ) -> tuple[str, tuple[int, bytes]]:
        """POST to the preferred endpoint, or to the next ones while none can be reached."""
        deadline = time.monotonic() + seconds
        count = len(self.endpoints)
        failures = []
        for attempt in range(count):
            index = (self._preferred + attempt) % count
            endpoint = self.endpoints[index]
            left = seconds if attempt == 0 else deadline - time.monotonic()
            if left <= 0:
                break
            context = self.tls if endpoint.scheme == "https" else None
            try:
                answer = post(endpoint.url, endpoint.address, path, payload, seconds=left,
                              take=take, context=context,
                              connect_within=left / (count - attempt))  # fmt: skip
            except EtcdUnreached as exc:
                failures.append(exc)
                continue
            except EtcdUnavailable:
                self._preferred = (index + 1) % count  # sent, unanswered: next call elsewhere
                raise
            self._preferred = index
            return endpoint.url, answer
        if len(failures) == 1:
            raise failures[0]
        whys = "; ".join(f"{f.url}: {f.why}" for f in failures) or "no time left"
        raise EtcdUnavailable(self.url, f"no endpoint reached: {whys}")


@contextmanager
def _reading(url: str, path: str) -> Iterator[None]:
    """Turn a reply field of the wrong type or form into EtcdRequestFailed."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        raise EtcdRequestFailed(url, -1, f"{path}: unexpected reply: {exc}") from exc


def _decode_reply(url: str, path: str, status: int, data: bytes) -> Json:
    """Decode a gateway reply; EtcdRequestFailed for an error reply or an undecodable one."""
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise EtcdRequestFailed(
            url, -1, f"{path}: a reply that is not JSON (HTTP {status}): {data[:120]!r}"
        ) from exc
    if not isinstance(reply, dict):
        raise EtcdRequestFailed(
            url, -1, f"{path}: a reply that is not a JSON object (HTTP {status})"
        )
    if status != 200 or ("error" in reply and "code" in reply):
        code = reply.get("code")
        message = reply.get("message", reply.get("error", f"HTTP {status}"))
        raise EtcdRequestFailed(
            url, code if type(code) is int else -1, f"{path}: {str(message)[:500]}"
        )
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


def _kvs(reply: Json) -> list[KeyValue]:
    listed = reply.get("kvs", [])
    if not isinstance(listed, list) or not all(isinstance(kv, dict) for kv in listed):
        raise ValueError(f"kvs is not a list of objects: {str(listed)[:200]}")
    return [KeyValue.from_json(kv) for kv in listed]


def _txn_result(reply: Json) -> TxnResult:
    responses = reply.get("responses", [])
    if not isinstance(responses, list):
        raise TypeError("txn reply: responses is not a list")
    reads = [
        _kvs(response["response_range"])
        for response in responses
        if isinstance(response, dict) and isinstance(response.get("response_range"), dict)
    ]
    return TxnResult(
        succeeded=reply.get("succeeded") is True, revision=_revision(reply), reads=reads
    )


def _lease(reply: Json) -> Lease:
    if reply.get("error"):
        raise ValueError(f"lease grant: {str(reply['error'])[:200]}")
    lease = Lease(id=as_int(reply, "ID"), ttl=as_int(reply, "TTL"))
    if lease.id == 0 or lease.ttl <= 0:
        raise ValueError(
            f"no lease ID and positive TTL in the reply (ID {lease.id}, TTL {lease.ttl})"
        )
    return lease


def _events(result: Json) -> list[WatchEvent]:
    listed = result.get("events", [])
    events = []
    for event in listed if isinstance(listed, list) else []:
        if not isinstance(event, dict) or not isinstance(event.get("kv", {}), dict):
            raise TypeError(f"a watch event that is not an object: {str(event)[:200]}")
        kind: Literal["PUT", "DELETE"] = "DELETE" if event.get("type") == "DELETE" else "PUT"
        events.append(WatchEvent(kind=kind, kv=KeyValue.from_json(event.get("kv", {}))))
    return events
