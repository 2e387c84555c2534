"""The certificates of ``loopd chaos cluster``, made by ``openssl`` as an operator makes them.

The commands are docs/scaling.md's ("Making the certificates with openssl"), run as
written (``tests/chaos_cluster/test_cluster_chaos_certs.py`` checks that the two agree):
one CA, then a leaf per name with its role's OU and extensions.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final

from chaos.cluster.netns_hosts import HarnessError
from supervisor.cluster.transport import Role, TlsFiles

OPENSSL: Final = "openssl"
SH: Final = shutil.which("sh") or "/bin/sh"
MAKE_CA: Final = """\
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \\
  -keyout ca.key -out ca.pem -days 3650 -subj "/O=example/CN=loopd cluster CA"
"""
LEAF: Final = """\
leaf() {  # leaf NAME OU EXTENSIONS: NAME.key, NAME.pem issued by the CA
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \\
    -keyout "$1.key" -out "$1.csr" -subj "/OU=$2/CN=$1"
  printf '%s\\n' "basicConstraints=CA:FALSE" "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \\
    -days 365 -out "$1.pem" -extfile "$1.ext"
}
"""
"""The two blocks of docs/scaling.md, character for character."""


def extensions(name: str, role: Role | None) -> str:
    """The third argument of ``leaf`` for ``role`` (None: etcd's server certificate,
    ``name`` its address), as the documented examples give it."""
    if role is Role.NODE:
        return f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth,clientAuth"
    if role is None:
        return f"subjectAltName=IP:{name}\nextendedKeyUsage=serverAuth,clientAuth"
    return "extendedKeyUsage=clientAuth"


class OpensslCertificates:
    """A cluster CA under ``root``, and the leaves it issues, all by ``openssl``."""

    def __init__(self, root: Path) -> None:
        if shutil.which(OPENSSL) is None:
            raise HarnessError("no 'openssl' on PATH (apt-get install -y openssl)")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._sh(MAKE_CA)
        self.ca_path = root / "ca.pem"

    def issue(self, name: str, role: Role | None) -> TlsFiles:
        """``leaf NAME OU EXTENSIONS`` for ``name`` (an address for etcd's certificate)."""
        kind = role.value if role is not None else "etcd"
        self._sh(LEAF + 'leaf "$1" "$2" "$3"\n', name, kind, extensions(name, role))
        return TlsFiles(
            ca=str(self.ca_path), cert=str(self.root / f"{name}.pem"),
            key=str(self.root / f"{name}.key"),
        )  # fmt: skip

    def _sh(self, script: str, *args: str) -> None:
        done = subprocess.run(
            [SH, "-c", "set -e\n" + script, "sh", *args], cwd=self.root, check=False,
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise HarnessError(f"openssl failed in {self.root}: {last}")
