"""What a source node serves of a moved session (``move_node``), and the TLS options' errors.

A sealed copy's files go only to the node its ``Handoff`` names; a name outside the
session's files is refused; a node with ``--listen`` and no cluster, or with only some
of the TLS files, refuses to start, saying what is missing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from supervisor.cluster.errors import MoveFailed
from supervisor.moves.move_node import CHUNK, read_chunk, sealed_manifest
from tests.harness.support import loopd
from worker import Baseline, Handoff, Owner, Session, User
from worker.store.disk.layout import session_dir


def sealed_session(home: Path, baseline: Baseline, to: str | None) -> str:
    with Session.create(home, "m", baseline) as opened:
        opened.append(Owner(node="a", token=5))
        opened.append(User(text="x" * (CHUNK + 10), key="k1"))
        if to is not None:
            opened.append(Handoff(to=to, token=5))
    return session_dir(home, "m")


def test_the_files_of_a_sealed_copy_go_only_to_the_node_it_is_sealed_for(
    home: Path, baseline: Baseline
) -> None:
    directory = sealed_session(home, baseline, to="b")
    with pytest.raises(MoveFailed, match="not sealed for c"):
        sealed_manifest(str(home), "m", ["c"])
    files = sealed_manifest(str(home), "m", ["b"])
    assert files
    for entry in files:
        data = (Path(directory) / str(entry["name"])).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    biggest = max(files, key=lambda f: int(str(f["size"])))
    first = read_chunk(str(home), "m", str(biggest["name"]), 0, ["b"])
    assert len(first["data"]) == CHUNK  # type: ignore[arg-type]
    assert first["eof"] is False
    rest = read_chunk(str(home), "m", str(biggest["name"]), CHUNK, ["b"])
    assert rest["eof"] is True
    with pytest.raises(MoveFailed, match="not sealed for c"):
        read_chunk(str(home), "m", str(biggest["name"]), 0, ["c"])
    for name in ("../../etc/passwd", "lock", "nothing"):
        with pytest.raises(MoveFailed, match="no file"):
            read_chunk(str(home), "m", name, 0, ["b"])


def test_an_unsealed_copy_and_a_name_outside_the_session_are_refused(
    home: Path, baseline: Baseline
) -> None:
    directory = sealed_session(home, baseline, to=None)
    with pytest.raises(MoveFailed, match="not sealed for b"):
        sealed_manifest(str(home), "m", ["b"])
    for name in [*os.listdir(directory), "../../etc/passwd", "lock", "nothing"]:
        with pytest.raises(MoveFailed, match="not sealed for b"):
            read_chunk(str(home), "m", name, 0, ["b"])


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--listen", "tls://127.0.0.1:7443"], "--listen needs --cluster URL and --node NAME"),
        (["--listen", "tcp://x:1"], "expected tls://HOST:PORT"),
        (["--listen", "tls://127.0.0.1:0"], "port 0 is no address a client can reach"),
        (["--tls-ca", "ca.pem"], "--tls-cert, --tls-key not given"),
    ],
)
def test_serve_refuses_an_incomplete_tls_setup_naming_what_is_wrong(
    tmp_path: Path, args: list[str], words: str
) -> None:
    done = loopd("serve", "--home", str(tmp_path / "h"), *args)
    assert done.returncode != 0
    assert words in done.stderr
    assert "Traceback" not in done.stderr
