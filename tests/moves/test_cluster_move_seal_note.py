"""The source of a move between hosts serves the copy it just sealed without reading its
log a second time, and only while the files are the very bytes it sealed (``move_node``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.moves import move_node
from supervisor.moves.move import abort_in_etcd, start_intent
from supervisor.moves.move_node import seal_here, sealed_manifest
from supervisor.moves.session_files import file_hashes
from tests.harness.cluster_support import create_session, register
from tests.harness.etcd_server import EtcdServer
from worker import Owner, Session, SessionError, User
from worker.store.disk.layout import session_dir
from worker.store.loader import load_session


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each directory whose log ``sealed_manifest`` reads and verifies."""
    seen: list[str] = []

    def counted(directory: str, session: str) -> object:
        seen.append(directory)
        return load_session(directory, session)

    monkeypatch.setattr(move_node, "load_session", counted)
    return seen


def sealed_on_a(client: EtcdClient, tmp_path: Path) -> tuple[Path, Callable[[], object]]:
    """Session ``m`` of node ``a`` with some requests, sealed by ``a`` for ``b``."""
    a = register(client, "a", tmp_path / "a")
    register(client, "b", tmp_path / "b")
    token = create_session(client, a, "m")
    with Session.open(a.home, "m") as opened:
        for n in range(20):
            opened.append(User(text=f"request {n}", key=f"k{n}"))
    assert start_intent(client, "m", "b") is not None

    def seal() -> dict[str, object]:
        return seal_here(client, "a", str(a.home), "m")

    assert seal()["token"] == token
    return a.home, seal


def test_the_copy_just_sealed_is_served_without_reading_its_log_again(
    etcd: EtcdServer, tmp_path: Path, reads: list[str]
) -> None:
    with EtcdClient(etcd.url) as client:
        home, seal = sealed_on_a(client, tmp_path)
        files = sealed_manifest(str(home), "m", ["b"])
        assert {f["name"] for f in files} == set(file_hashes(session_dir(home, "m")))
        assert reads == []
        with pytest.raises(MoveFailed, match="not sealed for c"):
            sealed_manifest(str(home), "m", ["c"])  # the seal's word names b only
        seal()  # a rerun of the seal: already sealed, noted again
        assert sealed_manifest(str(home), "m", ["b"]) == files
        assert reads == []


def test_a_copy_changed_after_its_seal_is_read_again_and_refused(
    etcd: EtcdServer, tmp_path: Path, reads: list[str]
) -> None:
    with EtcdClient(etcd.url) as client:
        home, _seal = sealed_on_a(client, tmp_path)
        _intent, token = abort_in_etcd(client, "m")
        with Session.open(home, "m") as opened:  # the source owns it again
            opened.append(Owner(node="a", token=token))
        with pytest.raises(MoveFailed, match="not sealed for b"):
            sealed_manifest(str(home), "m", ["b"])
        assert reads == [session_dir(home, "m")]


def test_a_sealed_copy_damaged_after_its_seal_is_not_served(
    etcd: EtcdServer, tmp_path: Path, reads: list[str]
) -> None:
    with EtcdClient(etcd.url) as client:
        home, _seal = sealed_on_a(client, tmp_path)
        log = max(Path(session_dir(home, "m")).glob("*.jsonl"), key=lambda p: p.stat().st_size)
        data = bytearray(log.read_bytes())
        at = data.index(b"request 7")
        data[at : at + 9] = b"request 8"  # the same size, another text
        log.write_bytes(bytes(data))
        with pytest.raises((MoveFailed, SessionError)):
            sealed_manifest(str(home), "m", ["b"])
        assert reads == [session_dir(home, "m")]


def test_a_file_chunk_is_served_only_of_a_manifest_served_to_the_node_it_is_sealed_for(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """``file`` (a chunk) as the TLS gateway answers it: refused before the manifest was
    asked for, refused to another node than the one the copy is sealed for, and never
    past the size the manifest gave, whatever was added to the file since."""
    with EtcdClient(etcd.url) as client:
        home, _seal = sealed_on_a(client, tmp_path)
        directory = Path(session_dir(home, "m"))
        log = max(directory.glob("*.jsonl"), key=lambda p: p.stat().st_size)

        def chunk(peer: str, offset: int = 0) -> dict[str, object]:
            message = {"op": "file", "id": 1, "session": "m", "name": log.name, "offset": offset}
            return move_node.answer_files(str(home), message, [peer])

        move_node._forget_seal(str(directory))  # a daemon that has served no manifest yet
        refused = chunk("b")
        assert refused["ok"] is False
        assert "manifest was not asked for first" in str(refused["error"])
        files = sealed_manifest(str(home), "m", ["b"])
        size = next(int(str(f["size"])) for f in files if f["name"] == log.name)
        assert chunk("c")["ok"] is False  # a node the copy is not sealed for
        served = chunk("b")
        assert served["ok"] is True
        assert served["result"] == {"data": log.read_bytes(), "eof": True}
        with log.open("ab") as f:
            f.write(b"bytes the manifest never named\n")
        assert chunk("b", size)["result"] == {"data": b"", "eof": True}
        assert chunk("b", size + 1)["ok"] is False
