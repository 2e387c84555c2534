"""A client of a cluster: find each session's owner through etcd and talk to that node.

Every reply from a cluster node carries the session's fencing token; the client keeps
the highest it has seen per session and refuses a lower one (``StaleOwner``): a late
reply from a former owner is never believed. A ``not_owner`` answer (the session moved,
or the node lost its lease) makes it look the owner up again and send the same request,
with the same key, so the retry applies once.

``send`` to a node at a ``tls://`` address takes the direct data path
(``tcp_direct.DirectLink``): one TLS connection per session, served by the session's
worker itself. A connection that ends without a reply (the worker died, was replaced or
the session moved) is made again and the request sent again with its key; there is no
other path it falls back to.
"""

from __future__ import annotations

import os
import time
import uuid

from supervisor.client.control import call
from supervisor.client.direct import Client
from supervisor.client.tcp_direct import DirectLink
from supervisor.cluster.errors import ClusterError, NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import owner_key
from supervisor.cluster.ownership import placement_of
from supervisor.cluster.peer_link import NodeLink, result_of
from supervisor.cluster.routing import (
    Route,
    TokenGuard,
    live_nodes,
    node_address,
    route,
    unix_socket_path,
)
from supervisor.cluster.transport import TlsFiles, tls_files_from_env
from supervisor.errors import ControlError
from supervisor.node.drain import least_loaded_node
from worker.ipc.wire import Message

REROUTE: frozenset[str] = frozenset(
    {"not_owner", "not_found", "no_daemon", "worker_died", "closed", "busy", "unavailable"}
)
"""Error codes after which the owner is looked up again and the request sent again (with
the same key: what was applied is answered from the log); ``closed``: a TLS connection
to a node or a worker that restarted or went away; ``busy``: the connection could not be
handed to the worker now (one that just died, say), nothing was sent; ``unavailable``:
the node does not serve the session now (a node cut off and back finds it STOPPED, its
ownership passed to another node meanwhile), nothing was applied."""
ATTEMPTS = 6
"""Tries of one ``send`` at least: each after a reroute or a connection that ended; more
while its ``retry_for`` lasts."""
RESEND_PAUSE = 0.05
"""Seconds before the second try, growing by as much each try (a worker restarting)..."""
MAX_PAUSE = 0.5
"""...up to this: a failover takes a lease TTL, and the new owner is found within this."""
NODE_RETRY_FOR = MAX_PAUSE
"""Seconds a request to a node on this machine (``unix:``) retries on that node's socket
before the owner is looked up again: 2 s made a failover take the lease TTL plus 2 s
whenever the owner key outlived the first 2 s of retries (4.1 s with a 2 s TTL)."""
OWNER_WATCH_SLICE = 0.5
"""Seconds of one watch of an owner key while a request waits for an owner."""


def home_of(address: str) -> str:
    """The home of a node reached at ``unix:<home>/loopd.sock`` (nodes on one machine)."""
    return os.path.dirname(unix_socket_path(address))


class ClusterClient:
    """Requests to the sessions of a cluster, each sent to the session's current owner."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        tls: TlsFiles | None = None,
        owner_wait: float = 0.0,
        retry_for: float | None = None,
    ) -> None:
        """``owner_wait``: seconds a request to a session nobody owns now waits for an
        owner (a failover in progress: another node's takeover), watching its owner key in
        etcd, before NotOwner is raised; 0 (the default): raised at once.

        ``retry_for``: seconds a ``send`` goes on retrying with its key while the owner
        cannot be reached or nobody owns the session (a failover: the old owner's key
        lives until its lease expires, then the next owner claims), ``timeout`` if None;
        at least ``ATTEMPTS`` tries are made whatever it is."""
        self.tls = tls if tls is not None else tls_files_from_env()
        self.etcd = EtcdClient(url, tls=self.tls.etcd_context() if self.tls else None)
        self.timeout = timeout
        self.owner_wait = owner_wait
        self.retry_for = timeout if retry_for is None else retry_for
        self.guard = TokenGuard()
        self._clients: dict[str, Client] = {}
        self._links: dict[str, NodeLink] = {}
        self._directs: dict[tuple[str, str], DirectLink] = {}  # (address, session)
        self._routes: dict[str, Route] = {}

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for link in self._links.values():
            link.close()
        for direct in self._directs.values():
            direct.close()
        self._links.clear()
        self._directs.clear()
        self.etcd.close()

    def create(self, session: str, *, slot: int = 0) -> object:
        """Create ``session`` on the live node holding the fewest sessions.

        An id placed already goes to its node: that node answers ``exists`` if it holds
        the session, and takes the placement up if it is its own create whose reply was
        lost (etcd answered too late), so a retried create creates the session once.
        """
        node = placement_of(self.etcd, session) or least_loaded_node(self.etcd)
        address = node_address(self.etcd, node)
        if address is None:
            raise NotOwner(session, f"node {node} left the cluster")
        return self._call(node, address, "create", session=session, slot=slot)

    def send(
        self, session: str, text: str, *, key: str | None = None, untrusted: bool = False
    ) -> Message:
        """Apply one request to ``session`` on its owner; the reply's token is checked."""
        key = key or uuid.uuid4().hex
        payload: Message = {"text": text, "key": key}
        if untrusted:
            payload["untrusted"] = True
        unacknowledged = False  # an attempt was written on the owner, not acknowledged
        deadline = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            last = attempt >= ATTEMPTS - 1 and time.monotonic() >= deadline
            this_one = False
            try:
                found = self._route(session, fresh=attempt > 0)
            except NotOwner:
                if last:
                    raise
                # Nobody owns it now (a failover between an owner's lease expiring and
                # the next owner's claim): asked again after a pause.
                attempt += 1
                time.sleep(_pause(attempt, deadline))
                continue
            try:
                if found.address.startswith("unix:"):
                    client = self._client(home_of(found.address))
                    result = client.send(session, text, key=key, untrusted=untrusted)
                else:
                    reply = self._direct(found, session).request(payload)
                    this_one = written_unacknowledged(reply)
                    unacknowledged = unacknowledged or this_one
                    answer = result_of(reply)
                    result = answer if isinstance(answer, dict) else {"result": answer}
            except ControlError as exc:
                if exc.code not in REROUTE or last:
                    if unacknowledged and not this_one:  # the last answer alone misleads
                        raise ControlError(exc.code, f"{exc.message} (an earlier attempt of "
                                           f"key {key} was written on the owner and not "
                                           "acknowledged: its outcome is unknown; send it "
                                           "again with the same key)") from exc  # fmt: skip
                    raise
                self._routes.pop(session, None)
                if found.address.startswith("unix:"):
                    self._drop(found.address)  # it may lead to a worker that no longer owns it
                else:
                    direct = self._directs.pop((found.address, session), None)
                    if direct is not None:
                        direct.close()
                attempt += 1
                if attempt > 1:
                    self._await_owner_change(found, _pause(attempt - 1, deadline))
                continue
            token = result.get("token")
            if type(token) is not int:
                raise ClusterError(f"session {session}: a reply without a fencing token")
            self.guard.check(session, token)
            return result

    def _await_owner_change(self, found: Route, seconds: float) -> None:
        """Pause ``seconds`` before trying the owner again, or less: until the owner key
        changes from the one ``found`` was read at (its lease expired, another node
        claimed it). A failover's takeover is then tried at once, not after the pause
        that has grown while the old owner's lease ran out (issue 30)."""
        if seconds <= 0:
            return
        until = time.monotonic() + seconds
        key = owner_key(found.session)
        try:
            if self.etcd.watch(key, start_revision=found.token + 1, wait=seconds):
                return
        except (ClusterError, OSError):
            pass  # no watch (etcd away, its history compacted): the pause alone
        time.sleep(max(0.0, until - time.monotonic()))

    def status(self) -> list[object]:
        """The status rows of every live node's sessions, each with its node's name."""
        rows: list[object] = []
        for node, address in sorted(live_nodes(self.etcd).items()):
            result = self._call(node, address, "status")
            for row in result if isinstance(result, list) else []:
                if isinstance(row, dict):
                    rows.append({**row, "node": node})
        return rows

    def _route(self, session: str, *, fresh: bool) -> Route:
        found = None if fresh else self._routes.get(session)
        if found is None:
            found = self._owner_route(session)
            self._routes[session] = found
        return found

    def _owner_route(self, session: str) -> Route:
        """The owner's route; while nobody owns the session, for up to ``owner_wait`` s,
        the owner key is watched from the revision the lookup read (so a takeover made
        right after it is seen at once), and looked up again when it changes."""
        deadline = time.monotonic() + self.owner_wait
        while True:
            revision = self.etcd.txn([], []).revision if self.owner_wait > 0 else 0
            try:
                return route(self.etcd, session)
            except NotOwner:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
            self.etcd.watch(owner_key(session), start_revision=revision + 1,
                            wait=min(left, OWNER_WATCH_SLICE))  # fmt: skip

    def _call(self, node: str, address: str, op: str, **fields: object) -> object:
        """One control request to ``node``: on its unix socket, or over TLS."""
        if address.startswith("unix:"):
            return call(home_of(address), op, timeout=self.timeout, **fields)
        return self._link(node, address).call(op, **fields)

    def _link(self, node: str, address: str) -> NodeLink:
        link = self._links.get(address)
        if link is None or link.node != node:
            if link is not None:
                link.close()  # another node registered at this address now
            if self.tls is None:
                raise ControlError("tls_needed", f"node {node} is at {address}: give "
                                   "--tls-ca, --tls-cert and --tls-key")  # fmt: skip
            link = self._links[address] = NodeLink(address, node, self.tls, timeout=self.timeout)
        return link

    # `_link`, `_direct` and `_client` are the steps that lead to sending: the chaos
    # rig's load (chaos/cluster/load.py) wraps them to know whether a failed request
    # may have been sent. Renaming one makes the rig count every failure as unknown.
    def _direct(self, found: Route, session: str) -> DirectLink:
        """The direct connection to ``session``'s worker on its node (tcp_direct)."""
        link = self._directs.get((found.address, session))
        if link is None or link.node != found.node:
            if link is not None:
                link.close()  # another node registered at this address now
            if self.tls is None:
                raise ControlError("tls_needed", f"node {found.node} is at {found.address}: "
                                   "give --tls-ca, --tls-cert and --tls-key")  # fmt: skip
            link = DirectLink(found.address, found.node, session, self.tls, timeout=self.timeout)
            self._directs[(found.address, session)] = link
        return link

    def _drop(self, address: str) -> None:
        if address.startswith("unix:"):
            dropped = self._clients.get(home_of(address))
            if dropped is not None:
                dropped.close()
        else:
            link = self._links.pop(address, None)
            if link is not None:
                link.close()

    def _client(self, home: str) -> Client:
        client = self._clients.get(home)
        if client is None:
            # A short retry of its own (a worker restarting under a live daemon): a dead
            # node's socket refusing is retried here, by a fresh look at the owner, not
            # against that socket for seconds past the owner key's expiry (issue 30).
            client = self._clients[home] = Client(
                home, timeout=self.timeout, retry_for=NODE_RETRY_FOR
            )
        return client


def _pause(attempt: int, deadline: float) -> float:
    """Seconds before try ``attempt + 1``: growing, capped, never past the deadline (but
    the minimal tries are made even after it)."""
    return max(0.0, min(RESEND_PAUSE * attempt, MAX_PAUSE, deadline - time.monotonic()))


def written_unacknowledged(reply: Message) -> bool:
    """True for a ``not_owner`` answer sent after the write (no ``before_write``): the
    request may be durable on the owner without being acknowledged."""
    failure = reply.get("error") if reply.get("ok") is not True else None
    return (
        isinstance(failure, dict)
        and failure.get("code") == "not_owner"
        and failure.get("before_write") is not True
    )
