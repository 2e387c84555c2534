"""The cluster's TCP transport: ``tls://HOST:PORT`` addresses, mutual TLS 1.3, roles.

Every peer holds a certificate of the cluster CA. What a certificate may do is named by
the organizational unit (OU) of its subject (docs/scaling.md, "The transport"):

- ``loopd-node``: a node. Its subjectAltName holds the node's name (``DNS:<node>``);
  a client reaching a node checks that the certificate names the node etcd names, and a
  node reaching another node for a move checks the same.
- ``loopd-client``: an application: ``create``, ``send``, ``status``, ``ping``.
- ``loopd-operator``: everything a local operator may do on the unix socket.

A certificate with none of these OUs is refused by every node, whatever CA signed it.
"""

from __future__ import annotations

import enum
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from supervisor.cluster.errors import ClusterError

TLS_SCHEME: Final = "tls"
HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds a node waits for a peer's TLS handshake before it drops the connection."""
ENV: Final = {"ca": "LOOPD_TLS_CA", "cert": "LOOPD_TLS_CERT", "key": "LOOPD_TLS_KEY"}


class Role(enum.Enum):
    """What a certificate may do, from the OU of its subject."""

    NODE = "loopd-node"
    CLIENT = "loopd-client"
    OPERATOR = "loopd-operator"


CLIENT_OPS: Final = frozenset({"ping", "status", "create", "send"})
NODE_OPS: Final = frozenset(
    {"ping", "files", "file", "replicate", "replica_position", "replica_line_ends",
     "replica_rewind"}
)  # fmt: skip
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
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED
        for what, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            if not os.path.isfile(path):
                raise TransportError(f"TLS {what} {path}: no such file")
        try:
            context.load_verify_locations(cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"TLS CA {self.ca}: not a PEM certificate ({exc})") from exc
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(
                f"TLS certificate {self.cert} with key {self.key}: cannot be loaded ({exc})"
            ) from exc
        return context

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


def _subject_field(cert: Mapping[str, object], name: str) -> list[str]:
    found = []
    subject = cert.get("subject", ())
    for rdn in subject if isinstance(subject, tuple) else ():
        for key, value in rdn:
            if key == name:
                found.append(str(value))
    return found


def role_of(cert: Mapping[str, object] | None) -> Role | None:
    """The role a verified peer certificate carries (its subject's OU), or None."""
    if not cert:
        return None
    roles = {role for role in Role for unit in _subject_field(cert, "organizationalUnitName")
             if unit == role.value}  # fmt: skip
    return roles.pop() if len(roles) == 1 else None


def dns_names(cert: Mapping[str, object] | None) -> list[str]:
    """The DNS names of a certificate's subjectAltName."""
    names = cert.get("subjectAltName", ()) if cert else ()
    pairs = names if isinstance(names, tuple) else ()
    return [str(value) for kind, value in pairs if kind == "DNS"]


def describe(cert: Mapping[str, object] | None) -> str:
    """A certificate in a few words for a log line: its CN, OU and DNS names."""
    if not cert:
        return "no certificate"
    common = ",".join(_subject_field(cert, "commonName")) or "-"
    units = ",".join(_subject_field(cert, "organizationalUnitName")) or "-"
    return f"CN={common} OU={units} DNS={','.join(dns_names(cert)) or '-'}"


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


def refusal(exc: BaseException) -> str:
    """A failed handshake in a few words (the SSL reason, not a traceback)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate refused: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or str(exc)).replace("_", " ").lower()
        if exc.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNSUPPORTED_PROTOCOL"):
            return f"not a TLS 1.3 handshake ({reason})"
        return reason
    if isinstance(exc, TimeoutError):
        return "no TLS handshake in time"
    return str(exc) or type(exc).__name__
