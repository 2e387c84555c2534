"""The cluster package's error family."""

from __future__ import annotations


class ClusterError(Exception):
    """Root of every error the cluster package raises."""


class EtcdUnavailable(ClusterError):
    """etcd could not be reached, or did not answer within the timeout."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(url, why)
        self.url = url
        self.why = why

    def __str__(self) -> str:
        return f"{self.url}: etcd unavailable: {self.why}"


class EtcdUnreached(EtcdUnavailable):
    """No connection was made (refused, unreachable, no TLS handshake): nothing was sent,
    so the request may go to another endpoint."""


class EtcdRequestFailed(ClusterError):
    """etcd answered a request with an error (gateway code and message), or badly (code -1)."""

    def __init__(self, url: str, code: int, message: str) -> None:
        super().__init__(url, code, message)
        self.url = url
        self.code = code
        self.message = message

    def __str__(self) -> str:
        if self.code == -1:  # no gateway code: a reply that is not what etcd sends
            return f"{self.url}: etcd sent a bad reply: {self.message}"
        return f"{self.url}: etcd refused the request (code {self.code}): {self.message}"


class NotOwner(ClusterError):
    """This node does not own the session (or can no longer prove that it does)."""

    def __init__(self, session: str, why: str) -> None:
        super().__init__(session, why)
        self.session = session
        self.why = why

    def __str__(self) -> str:
        return f"session {self.session}: not the owner: {self.why}"


class AlreadyPlaced(NotOwner):
    """A new session's id is placed already: on ``node`` (ids are cluster-wide)."""

    def __init__(self, session: str, node: str) -> None:
        super().__init__(session, f"the session already exists on {node}")
        self.args = (session, node)
        self.node = node


class Cordoned(ClusterError):
    """A new session was to be placed on a cordoned node (``loopd cordon``)."""

    def __init__(self, session: str, node: str) -> None:
        super().__init__(session, node)
        self.session = session
        self.node = node

    def __str__(self) -> str:
        return (f"session {self.session}: node {self.node} is cordoned: no new session is "
                f"placed on it (`loopd uncordon {self.node}`)")  # fmt: skip


class StaleOwner(ClusterError):
    """A reply carried a lower fencing token than one already seen for the session."""

    def __init__(self, session: str, token: int, seen: int) -> None:
        super().__init__(session, token, seen)
        self.session = session
        self.token = token
        self.seen = seen

    def __str__(self) -> str:
        return (
            f"session {self.session}: reply refused: its token {self.token} is lower "
            f"than {self.seen}, already seen (a late reply from a former owner)"
        )


class MoveFailed(ClusterError):
    """A move could not go on; ``step`` names where it stopped (docs/scaling.md section 6)."""

    def __init__(self, session: str, step: str, why: str) -> None:
        super().__init__(session, step, why)
        self.session = session
        self.step = step
        self.why = why

    def __str__(self) -> str:
        return f"session {self.session}: move stopped at {self.step}: {self.why}"


class BadClusterValue(ClusterError):
    """A value in etcd under loopd's prefix is not what loopd writes there."""

    def __init__(self, data: bytes, why: str) -> None:
        super().__init__(data, why)
        self.data = data
        self.why = why

    def __str__(self) -> str:
        return f"unexpected value in etcd ({self.why}): {self.data[:200]!r}"
