"""Tenants on a node's TLS port: a client certificate's O= is its tenant.

One etcd and one node (``a``) per test. Two tenants' client certificates (``O=acme``,
``O=globex``) and an operator's; each refusal of docs/operations.md ("Tenants") is tried
through the relayed control path and the direct data path (the worker's own handshake),
with another tenant's certificate, a guessed session id and a forged ``tenant`` field.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.client.cluster import ClusterClient
from supervisor.client.tcp_direct import DirectLink
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.transport import Role, TlsFiles, direct_preamble
from supervisor.errors import ControlError
from supervisor.sessions.tenants import EXISTS_TO_A_TENANT
from tests.harness.etcd_server import EtcdServer, free_port
from tests.harness.support import Daemon, log_user_keys, poll_until, status
from tests.harness.tls_certs import Certificates
from worker.ipc.wire import encode

pytestmark = pytest.mark.timeout(120)


@dataclass
class Tenants:
    etcd: EtcdServer
    node: Daemon
    address: str
    acme: TlsFiles
    globex: TlsFiles
    operator: TlsFiles

    def link(self, files: TlsFiles) -> NodeLink:
        return NodeLink(self.address, "a", files, timeout=20)

    def direct(self, files: TlsFiles, session: str, text: str, key: str) -> dict[str, object]:
        """One request on the direct path; the reply's result, or its error (code, message)."""
        link = DirectLink(self.address, "a", session, files, timeout=20)
        try:
            reply = link.request({"text": text, "key": key})
        finally:
            link.close()
        failure = reply.get("error")
        if isinstance(failure, dict):
            return {"code": failure["code"], "message": failure["message"]}
        result = reply["result"]
        assert isinstance(result, dict)
        return result


def start_tenants(tmp_path: Path, *more: str) -> Iterator[Tenants]:
    root = tmp_path / "tls"
    certs = Certificates(root / "certs")
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    try:
        address = f"tls://127.0.0.1:{free_port()}"
        args = ["--cluster", etcd.url, "--node", "a", "--listen", address, *more]
        node = Daemon(root / "a", *args, *certs.args(certs.issue("a", Role.NODE)))
        try:
            found = Tenants(
                etcd, node, address,
                certs.issue_tenant("acme-app", Role.CLIENT, "acme"),
                certs.issue_tenant("globex-app", Role.CLIENT, "globex"),
                certs.issue_tenant("alice", Role.OPERATOR, "ops"),
            )  # fmt: skip
            with ClusterClient(etcd.url, timeout=20, tls=found.acme) as acme:
                acme.create("a1")
                assert acme.send("a1", "hello", key="k1")["text"] == "echo: hello"
            yield found
        finally:
            node.stop()
    finally:
        etcd.stop()


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[Tenants]:
    yield from start_tenants(tmp_path)


@pytest.fixture
def hibernating(tmp_path: Path) -> Iterator[Tenants]:
    yield from start_tenants(tmp_path, "--idle-stop", "2")


def first_frame(tenants: Tenants, files: TlsFiles | None, session: str) -> bytes:
    """The plaintext of the first frame a direct connection to ``session`` gets, after one
    request sent at once; b"" if the connection ended without one (a handshake refused).
    ``files`` None: a client with no certificate of its own."""
    host, port = tenants.address.removeprefix("tls://").split(":")
    if files is None:
        context = ssl.create_default_context(cafile=str(Path(tenants.acme.ca)))
    else:
        context = files.client_context()
    raw = socket.create_connection((host, int(port)), timeout=20)
    received = b""
    with contextlib.suppress(ssl.SSLError, OSError):
        raw.sendall(direct_preamble(session))
        with context.wrap_socket(raw, server_hostname="a") as sock:
            sock.sendall(encode({"id": 1, "op": "request", "request": {"text": "x", "key": "g"}}))
            while len(received) < 4 or len(received) < 4 + int.from_bytes(received[:4], "big"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                received += chunk
    raw.close()
    return received


def refused(link: NodeLink, op: str, **fields: object) -> ControlError:
    with pytest.raises(ControlError) as caught:
        link.call(op, **fields)
    assert caught.value.code == "forbidden", caught.value
    assert "\n" not in str(caught.value)
    return caught.value


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        pytest.param("status", {}, id="status"),
        pytest.param("send", {"text": "mine now", "key": "g1"}, id="send"),
        pytest.param(
            "send",
            {"text": "mine now", "key": "g2", "tenant": "acme"},
            id="send-with-a-forged-tenant-field",
        ),
        pytest.param("status", {"tenant": "loopd-operator"}, id="status-posing-as-operator"),
    ],
)
def test_another_tenants_session_and_a_guessed_id_are_refused_alike_on_the_relayed_path(
    tenants: Tenants, op: str, fields: dict[str, object]
) -> None:
    link = tenants.link(tenants.globex)
    try:
        theirs = refused(link, op, session="a1", **fields)
        guessed = refused(link, op, session="zz9", **fields)
    finally:
        link.close()
    assert str(theirs) == str(guessed)
    assert "globex" in str(theirs)
    assert log_user_keys(tenants.node.home, "a1") == ["k1"]  # nothing of globex's applied


def test_another_tenants_session_and_a_guessed_id_are_refused_alike_on_the_direct_path(
    tenants: Tenants,
) -> None:
    theirs = tenants.direct(tenants.globex, "a1", "mine now", "g1")
    guessed = tenants.direct(tenants.globex, "zz9", "mine now", "g1")
    assert theirs == guessed
    assert theirs["code"] == "forbidden"
    assert log_user_keys(tenants.node.home, "a1") == ["k1"]
    # The owner is served on the same path, and the operator too.
    assert tenants.direct(tenants.acme, "a1", "again", "k2")["text"] == "echo: again"
    assert tenants.direct(tenants.operator, "a1", "op", "k3")["text"] == "echo: op"
    assert log_user_keys(tenants.node.home, "a1") == ["k1", "k2", "k3"]


def test_a_tenant_lists_its_own_sessions_and_the_operator_every_one(tenants: Tenants) -> None:
    with ClusterClient(tenants.etcd.url, timeout=20, tls=tenants.globex) as globex:
        globex.create("g1")
    rows = {}
    for name, files in (("acme", tenants.acme), ("globex", tenants.globex),
                        ("operator", tenants.operator)):  # fmt: skip
        link = tenants.link(files)
        try:
            listed = link.call("status")
        finally:
            link.close()
        assert isinstance(listed, list)
        rows[name] = sorted(row["session"] for row in listed)
    assert rows == {"acme": ["a1"], "globex": ["g1"], "operator": ["a1", "g1"]}


def test_a_session_made_before_tenants_or_by_the_operator_is_no_clients(tenants: Tenants) -> None:
    call(str(tenants.node.home), "create", session="old1")  # on the control socket: no tenant
    link = tenants.link(tenants.operator)
    try:
        link.call("create", session="op1")
        assert link.call("status", session="op1")
        assert link.call("status", session="a1")  # the operator sees every session
    finally:
        link.close()
    for session in ("old1", "op1"):
        link = tenants.link(tenants.acme)
        try:
            refused(link, "status", session=session)
        finally:
            link.close()
        assert tenants.direct(tenants.acme, session, "x", "k")["code"] == "forbidden"


def test_an_op_of_the_operator_is_refused_to_a_tenant_even_if_its_role_may_ask_it(
    tenants: Tenants,
) -> None:
    """A local caller (the owner) narrowed to a tenant: the daemon's rule, not the role's."""
    with pytest.raises(ControlError, match="op 'metrics' is the operator's"):
        call(str(tenants.node.home), "metrics", tenant="acme")
    with pytest.raises(ControlError, match="op 'forget' is the operator's"):
        call(str(tenants.node.home), "forget", session="a1", tenant="acme")


def test_a_tenants_create_of_a_taken_id_is_exists_without_the_homes_path(
    tenants: Tenants,
) -> None:
    """Another tenant's id is ``exists`` (ids are one namespace), in words that name
    neither the home's path nor the node; the operator still gets the detail."""
    link = tenants.link(tenants.globex)
    try:
        with pytest.raises(ControlError) as caught:
            link.call("create", session="a1")
    finally:
        link.close()
    assert caught.value.code == "exists"
    assert caught.value.message == EXISTS_TO_A_TENANT
    with pytest.raises(ControlError) as told:
        call(str(tenants.node.home), "create", session="a1")
    assert told.value.code == "exists"
    assert str(tenants.node.home) in told.value.message


def test_the_direct_path_answers_another_tenants_session_in_the_bytes_of_a_guessed_id(
    tenants: Tenants,
) -> None:
    """The node's TLS thread checks the tenant before any handover: another tenant's
    session and an id nobody created get the same frame, byte for byte (its ``id`` too),
    before the request sent after the handshake is read."""
    theirs = first_frame(tenants, tenants.globex, "a1")
    guessed = first_frame(tenants, tenants.globex, "zz9")
    assert theirs, "no answer"
    assert theirs == guessed
    assert b"forbidden" in theirs
    assert log_user_keys(tenants.node.home, "a1") == ["k1"]
    assert tenants.direct(tenants.acme, "a1", "x", "k2")["text"] == "echo: x"  # its owner's


def test_a_refused_peer_on_the_direct_path_wakes_no_hibernated_session(
    hibernating: Tenants,
) -> None:
    """Neither a connection without a certificate nor another tenant's wakes a session its
    idle stop put to sleep: nothing is handed to a worker before the check."""
    home = hibernating.node.home
    poll_until(lambda: status(home, "a1")["state"] == "IDLE", what="a1 hibernated")
    assert first_frame(hibernating, None, "a1") == b""  # refused at the handshake
    assert b"forbidden" in first_frame(hibernating, hibernating.globex, "a1")
    assert status(home, "a1")["state"] == "IDLE"
    woken = hibernating.direct(hibernating.acme, "a1", "x", "k2")  # the owner wakes it
    assert woken["text"] == "echo: x"
