"""The cluster's TCP transport: ``tls://HOST:PORT`` addresses, mutual TLS 1.3, roles.

Every peer holds a certificate of the cluster CA. What a certificate may do is named by
the organizational unit (OU) of its subject (docs/scaling.md, "The transport"):

- ``loopd-node``: a node. Its subjectAltName holds the node's name (``DNS:<node>``);
  a client reaching a node checks that the certificate names the node etcd names, and a
  node reaching another node for a move checks the same.
- ``loopd-client``: an application: ``create``, ``send``, ``status``, ``ping``.
- ``loopd-operator``: everything a local operator may do on the unix socket.

A certificate with none of these OUs is refused by every node, whatever CA signed it.
The contexts, roles and refusals themselves are ``worker/ipc/tls_roles.py``: a worker makes
the handshake of a TCP connection handed to it with the same rules (the direct path).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from supervisor.cluster.errors import ClusterError
from worker.ipc.tls_roles import (
    HANDSHAKE_TIMEOUT,
    Role,
    TlsSetupError,
    describe,
    dns_names,
    load_context,
    refusal,
    role_of,
)
from worker.store.errors import InvalidSessionId
from worker.store.session_id import MAX_LENGTH, validate_session_id

__all__ = [
    "ALLOWED", "DIRECT_PREAMBLE", "ENV", "HANDSHAKE_TIMEOUT", "MAX_PREAMBLE", "Role",
    "TlsFiles", "TransportError", "check_node_certificate", "describe", "direct_preamble",
    "dns_names", "own_certificate_problem", "parse_preamble",
    "parse_tls_address", "refusal", "role_of", "tls_files_from_env",
]  # fmt: skip

TLS_SCHEME: Final = "tls"
DIRECT_PREAMBLE: Final = b"loopd-direct/2 "
"""A connection of the direct data path opens with this, the session's id and a newline,
in plaintext, then starts TLS (docs/scaling.md, "How the port is served"). ``/2``: the
node's TLS thread makes the first handshake and checks the tenant before the worker
makes a second; a client of the first protocol (``loopd-direct ``) is refused at its
preamble instead of being taken for a client of this one. Its first
byte is never 0x16, the first of a TLS handshake record: a client that starts TLS at
once is told apart by one byte, as PostgreSQL tells its SSLRequest from a startup."""
MAX_PREAMBLE: Final = len(DIRECT_PREAMBLE) + MAX_LENGTH + 1
ENV: Final = {"ca": "LOOPD_TLS_CA", "cert": "LOOPD_TLS_CERT", "key": "LOOPD_TLS_KEY"}


CLIENT_OPS: Final = frozenset({"ping", "status", "create", "send"})
NODE_OPS: Final = frozenset({"ping", "files", "file"})
OPERATOR_OPS: Final = frozenset(
    {"ping", "status", "create", "send", "compact", "start", "stop", "restart", "adopt",
     "forget", "metrics", "seal", "pull", "release", "discard", "receive", "install"}
)  # fmt: skip
ALLOWED: Final[Mapping[Role, frozenset[str]]] = {
    Role.CLIENT: CLIENT_OPS,
    Role.NODE: NODE_OPS,
    Role.OPERATOR: OPERATOR_OPS,
}
"""The control operations each role may ask over TLS (``connect`` passes a descriptor,
which TCP cannot carry, so no role has it)."""


class TransportError(ClusterError):
    """A TLS address, file or peer that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files of one peer: the cluster CA, its certificate and its private key."""

    ca: str
    cert: str
    key: str

    @classmethod
    def from_options(cls, ca: str | None, cert: str | None, key: str | None) -> TlsFiles | None:
        """All three or none (then None); TransportError naming what is missing."""
        given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
        if all(value is None for value in given.values()):
            return None
        missing = [name for name, value in given.items() if value is None]
        if missing:
            raise TransportError(f"TLS needs all of --tls-ca, --tls-cert, --tls-key: "
                                 f"{', '.join(missing)} not given")  # fmt: skip
        assert ca is not None
        assert cert is not None
        assert key is not None
        return cls(ca=ca, cert=cert, key=key)

    def _load(self, context: ssl.SSLContext) -> ssl.SSLContext:
        try:
            return load_context(context, self.ca, self.cert, self.key)
        except TlsSetupError as exc:
            raise TransportError(str(exc)) from exc

    def server_context(self) -> ssl.SSLContext:
        """A node's listening context: TLS 1.3, a client certificate of the CA required."""
        return self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))

    def client_context(self) -> ssl.SSLContext:
        """A client's context: TLS 1.3, the node's certificate checked against its name."""
        context = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        context.check_hostname = True
        return context

    def etcd_context(self) -> ssl.SSLContext:
        """The context for ``https://`` etcd endpoints: this certificate presented to etcd
        (``--client-cert-auth``), etcd's checked against the CA and the endpoint's host.
        TLS 1.2 is allowed here: etcd 3.5 servers speak at most TLS 1.2 by default."""
        context = self.client_context()
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context


def tls_files_from_env(environ: Mapping[str, str] = os.environ) -> TlsFiles | None:
    """The TLS files named by LOOPD_TLS_CA/CERT/KEY, or None if none is set."""
    return TlsFiles.from_options(environ.get(ENV["ca"]), environ.get(ENV["cert"]),
                                 environ.get(ENV["key"]))  # fmt: skip


def parse_tls_address(address: str) -> tuple[str, int]:
    """``tls://HOST:PORT`` -> (HOST, PORT); TransportError naming what is wrong."""
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != TLS_SCHEME or not parts.hostname or port is None or parts.path:
        raise TransportError(f"{address!r}: expected tls://HOST:PORT")
    if port == 0:  # the address is registered in etcd as given: it must be reachable
        raise TransportError(f"{address!r}: port 0 is no address a client can reach; name one")
    return parts.hostname, port


def check_node_certificate(cert: Mapping[str, object] | None, node: str) -> None:
    """A node's certificate must carry the node role and name ``node``; else TransportError.

    The hostname check of ``ssl`` already matched ``node`` against the subjectAltName
    when the handshake was made with ``server_hostname=node``; this adds the role.
    """
    role = role_of(cert)
    if role is not Role.NODE:
        raise TransportError(
            f"the certificate of node {node} is not a node certificate ({describe(cert)})"
        )
    if node not in dns_names(cert):
        raise TransportError(
            f"the certificate of node {node} names another node ({describe(cert)})"
        )


def own_certificate_problem(files: TlsFiles, node: str) -> str | None:
    """Why ``files`` cannot be node ``node``'s certificate, or None (checked at ``serve``)."""
    try:
        decoded = ssl._ssl._test_decode_cert(files.cert)  # type: ignore[attr-defined]
    except (OSError, ssl.SSLError, ValueError) as exc:
        return f"TLS certificate {files.cert}: cannot be read ({exc})"
    if role_of(decoded) is not Role.NODE:
        return (f"TLS certificate {files.cert} is not a node certificate "
                f"(OU {Role.NODE.value} expected; it is {describe(decoded)})")  # fmt: skip
    if node not in dns_names(decoded):
        return (f"TLS certificate {files.cert} does not name node {node} in its "
                f"subjectAltName ({describe(decoded)})")  # fmt: skip
    return None


def direct_preamble(session: str) -> bytes:
    """The plaintext line that opens a direct connection to ``session``'s worker."""
    return DIRECT_PREAMBLE + validate_session_id(session).encode() + b"\n"


def parse_preamble(line: bytes) -> str:
    """The session a preamble line (with its newline) names; TransportError if it is none."""
    if not line.startswith(DIRECT_PREAMBLE) or not line.endswith(b"\n"):
        raise TransportError(f"not a loopd-direct preamble: {line[:80]!r}")
    try:
        return validate_session_id(line[len(DIRECT_PREAMBLE) : -1].decode("ascii"))
    except (UnicodeDecodeError, InvalidSessionId) as exc:
        raise TransportError(f"a preamble naming no valid session: {exc}") from exc
