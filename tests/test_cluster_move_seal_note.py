"""The source of a move between hosts serves the copy it just sealed without reading its
log a second time, and only while the files are the very bytes it sealed (``move_node``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.cluster import move_node
from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.move import abort_in_etcd, start_intent
from supervisor.cluster.move_node import seal_here, sealed_manifest
from supervisor.cluster.session_files import file_hashes
from tests.cluster_support import create_session, register
from tests.etcd_server import EtcdServer
from worker import Owner, Session, SessionError, User
from worker.store.layout import session_dir
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
