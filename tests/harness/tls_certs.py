"""Certificates for the TLS tests, made with ``trustme``: a cluster CA and its roles.

Each role is the OU of the subject (``supervisor/cluster/transport.py``): ``loopd-node``
with the node's name in the subjectAltName, ``loopd-client``, ``loopd-operator``.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import trustme

from supervisor.cluster.transport import Role, TlsFiles


class Certificates:
    """A cluster CA and the PEM files it issues, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA(organization_name="loopd test cluster")
        self.ca_path = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))

    def issue_tenant(self, name: str, role: Role, organization: str) -> TlsFiles:
        """A certificate of ``role`` whose subject's O is ``organization`` (its tenant)."""
        leaf = self.ca.issue_cert(
            name,
            common_name=name,
            organization_name=organization,
            organization_unit_name=role.value,
        )
        cert, key = self.root / f"{name}.pem", self.root / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return TlsFiles(ca=str(self.ca_path), cert=str(cert), key=str(key))

    def issue(
        self,
        name: str,
        role: Role | None,
        *,
        ca: trustme.CA | None = None,
        expired: bool = False,
        dns: str | None = None,
    ) -> TlsFiles:
        """A certificate of ``role`` for ``name`` (its DNS name ``dns`` or ``name``, or an
        IP address); without a role, one of no loopd role (etcd's server certificate)."""
        signer = ca or self.ca
        now = datetime.datetime.now(datetime.UTC)
        days = datetime.timedelta(days=1)
        leaf = signer.issue_cert(
            dns or name, common_name=name, organization_unit_name=role.value if role else None,
            not_before=now - 2 * days if expired else None,
            not_after=now - days if expired else None,
        )  # fmt: skip
        kind = role.value if role else "server"
        tag = f"{name}-{kind}{'-expired' if expired else ''}{'-other' if ca else ''}"
        cert, key = self.root / f"{tag}.pem", self.root / f"{tag}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return TlsFiles(ca=str(self.ca_path), cert=str(cert), key=str(key))

    def args(self, files: TlsFiles) -> list[str]:
        return ["--tls-ca", files.ca, "--tls-cert", files.cert, "--tls-key", files.key]
