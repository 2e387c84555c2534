"""The TLS rules every end of the cluster's transport shares: contexts, roles, refusals.

What a certificate may do is named by the organizational unit (OU) of its subject
(docs/scaling.md, "The transport"): ``loopd-node``, ``loopd-client``, ``loopd-operator``;
whose sessions a client's reaches, by its organization (O), else its CN (its tenant).
The worker needs these to make the handshake of a TCP connection handed to it (the
direct data path); ``supervisor/cluster/transport.py`` builds on the same functions, so
both ends of the port apply one set of rules.
"""

from __future__ import annotations

import enum
import os
import re
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


MAX_TENANT: Final = 128
TENANT_NAME: Final = re.compile(
    r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]{1,128}"
)
"""A tenant's name: 1 to 128 characters, none a control character, C0 or C1, a line or
paragraph separator or a bidirectional override (it is written to a file and to logs;
docs/operations.md, "Tenants")."""
RESERVED_TENANT: Final = "loopd-operator"
"""The operator's name: no client certificate's tenant, whatever its subject says."""
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


def tenant_of(cert: Mapping[str, object] | None) -> str | None:
    """A certificate's tenant: its subject's one O (organizationName), else its one CN;
    None if it has neither (or several), or a name no tenant can have."""
    if not cert:
        return None
    for name in ("organizationName", "commonName"):
        values = _subject_field(cert, name)
        if len(values) == 1:
            good = TENANT_NAME.fullmatch(values[0]) and values[0] != RESERVED_TENANT
            return values[0] if good else None
        if values:
            return None
    return None


def not_yours(tenant: str) -> str:
    """The one refusal of a session that is not ``tenant``'s, whether it exists or not."""
    return (f"tenant {tenant!r} may not reach this session (a tenant reaches only the "
            "sessions it created)")  # fmt: skip


def tenant_refusal(cert: Mapping[str, object] | None, owner: str | None) -> str | None:
    """Why a verified peer may not reach a session of tenant ``owner`` (None: the
    operator's), or None if it may: an operator reaches every session, a client its
    certificate's tenant's only."""
    role = role_of(cert)
    if role is Role.OPERATOR:
        return None
    if role is not Role.CLIENT:
        return direct_refusal(cert)
    tenant = tenant_of(cert)
    if tenant is None:
        return f"a loopd-client certificate without a tenant (O= or CN=) ({describe(cert)})"
    return None if tenant == owner else not_yours(tenant)


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
