"""The certificates of ``loopd chaos cluster``: docs/scaling.md's openssl commands, run.

The rig runs the documented commands character for character (``chaos/cluster/certs.py``);
here: the docs and the module agree, and what they make is what the transport wants (a
node certificate naming its node, a client one, an operator one, etcd's by address),
shown by a TLS 1.3 handshake on loopback as a node and its peers make it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
from pathlib import Path

import pytest

from chaos.cluster.certs import LEAF, MAKE_CA, OpensslCertificates, extensions
from supervisor.cluster.transport import Role, TlsFiles, own_certificate_problem, role_of
from tests.harness.support import REPO

DOC = (REPO / "docs" / "scaling.md").read_text()


def test_the_rig_runs_the_commands_of_the_docs() -> None:
    section = DOC[DOC.index("### Making the certificates with openssl") :]
    block = section[section.index("```sh\n") + 6 : section.index("```\n", 10)]
    assert block.startswith(MAKE_CA + LEAF)
    # Each documented leaf is the extensions the rig gives that role.
    for name, ou, role in (("a", "loopd-node", Role.NODE), ("app1", "loopd-client", Role.CLIENT),
                           ("alice", "loopd-operator", Role.OPERATOR)):  # fmt: skip
        assert f'leaf {name} {ou} "{extensions(name, role)}"' in block
    etcd = re.search(r'leaf etcd1 etcd "subjectAltName=IP:([0-9.]+)\n', block)
    assert etcd is not None
    assert f'"{extensions(etcd.group(1), None)}"' in block


def handshake(server: TlsFiles, client: TlsFiles, name: str) -> dict[str, object]:
    """The client's view of the server's certificate after a mutual TLS handshake, and
    the server's view of the client's."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, object] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with server.server_context().wrap_socket(conn, server_side=True) as tls:
            seen["client"] = tls.getpeercert()
            tls.sendall(b"x")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        raw = socket.create_connection(listener.getsockname(), timeout=10)
        with client.client_context().wrap_socket(raw, server_hostname=name) as tls:
            seen["server"] = tls.getpeercert()
            seen["version"] = tls.version()
            assert tls.recv(1) == b"x"
    finally:
        thread.join(timeout=10)
        listener.close()
    return seen


def test_the_openssl_certificates_are_what_the_transport_wants(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:  # .ci/run installs it: under CI it must be there
        if os.environ.get("CI") == "true":
            pytest.fail("no openssl on PATH")
        pytest.skip("no openssl on PATH")
    certs = OpensslCertificates(tmp_path)
    node = certs.issue("a", Role.NODE)
    client = certs.issue("app1", Role.CLIENT)
    operator = certs.issue("alice", Role.OPERATOR)
    assert own_certificate_problem(node, "a") is None
    assert own_certificate_problem(node, "b") is not None  # its SAN names a only
    for peer, role in ((client, Role.CLIENT), (operator, Role.OPERATOR), (node, Role.NODE)):
        seen = handshake(node, peer, "a")
        assert seen["version"] == "TLSv1.3"
        assert role_of(seen["client"]) is role  # type: ignore[arg-type]
        assert role_of(seen["server"]) is Role.NODE  # type: ignore[arg-type]
    etcd = certs.issue("127.0.0.1", None)
    seen = handshake(etcd, node, "127.0.0.1")  # etcd's certificate, by its IP address
    assert role_of(seen["server"]) is None  # type: ignore[arg-type]
