"""The TLS rules every end of the cluster's transport shares: contexts, roles, refusals.

What a certificate may do is named by the organizational unit (OU) of its subject
(docs/scaling.md, "The transport"): ``loopd-node``, ``loopd-client``, ``loopd-operator``.
The worker needs these to make the handshake of a TCP connection handed to it (the
direct data path); ``supervisor/cluster/transport.py`` builds on the same functions, so
both ends of the port apply one set of rules.
"""

from __future__ import annotations

import enum
import os
import ssl
from collections.abc import Mapping
from typing import Final

HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds a node (its TLS thread, or a worker) waits for a peer's TLS handshake."""


class Role(enum.Enum):
    """What a certificate may do, from the OU of its subject."""

    NODE = "loopd-node"
    CLIENT = "loopd-client"
    OPERATOR = "loopd-operator"


DIRECT_ROLES: Final = frozenset({Role.CLIENT, Role.OPERATOR})
"""The roles that may use the direct data path (a TCP connection served by the worker).
A node certificate may do nothing on it: nodes ask nodes for files, never for requests."""


class TlsSetupError(Exception):
    """A CA, certificate or key file that cannot be loaded; the message is one line."""


def load_context(context: ssl.SSLContext, ca: str, cert: str, key: str) -> ssl.SSLContext:
    """``context`` with TLS 1.3 minimum, a peer certificate of ``ca`` required, and this
    end's certificate and key loaded; TlsSetupError naming the file that is wrong."""
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    for what, path in (("CA", ca), ("certificate", cert), ("key", key)):
        if not os.path.isfile(path):
            raise TlsSetupError(f"TLS {what} {path}: no such file")
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupError(f"TLS CA {ca}: not a PEM certificate ({exc})") from exc
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupError(
            f"TLS certificate {cert} with key {key}: cannot be loaded ({exc})"
        ) from exc
    return context


def server_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """A node's listening context: TLS 1.3, a client certificate of the CA required."""
    return load_context(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ca, cert, key)


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


def direct_refusal(cert: Mapping[str, object] | None) -> str | None:
    """Why a verified peer may not use the direct data path, or None if it may."""
    role = role_of(cert)
    if role is None:
        return f"a certificate without a loopd role ({describe(cert)})"
    if role not in DIRECT_ROLES:
        return (f"a {role.value} certificate may not send requests ({describe(cert)}): "
                "the data path is for loopd-client and loopd-operator certificates")  # fmt: skip
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
