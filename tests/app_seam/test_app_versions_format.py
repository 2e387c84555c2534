"""App versions in the log: the version rule, SessionStart's app block, AppChanged.

Every SessionStart a worker writes names its App and version; a log written before
(none of them) opens, verifies and re-encodes byte for byte as before; a forged block or
an AppChanged that does not follow on is refused by open and ``loopd verify``.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.forge import rewrite_line
from tests.harness.support import loopd
from worker import Baseline, InvalidLog, Session, TornLog, User
from worker.app.version import app_version, source_digest
from worker.loop.app_change import note_app_change
from worker.store.format.records import AppChanged, SessionStart, decode_record, encode_lines
from worker.store.format.writer_app import clear_app, stamp_app

BASELINE = Baseline(system="s", memory="", tools=[])
OLD_START = (
    b'{"type":"SessionStart","time":"2026-01-02T03:04:05.000006Z","session":"s","epoch":0,'
    b'"slot":0,"baseline":"ab","crc":"%s"}\n'
)


@pytest.fixture(autouse=True)
def _no_stamp_left() -> Iterator[None]:
    clear_app()
    yield
    clear_app()


def _start(log: Path) -> SessionStart:
    start = decode_record(log.read_bytes().splitlines()[0])
    assert isinstance(start, SessionStart)
    return start


def _write_module(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("vapp_")]:
        del sys.modules[name]
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


@pytest.mark.timeout(60)
def test_the_version_is_the_app_classes_then_the_modules_then_a_digest_of_its_file(
    modules: Path,
) -> None:
    _write_module(modules, "vapp_class", "version = 'mod'\nclass A:\n    version = ' 2.1 '\n")
    _write_module(modules, "vapp_module", "version = 'mod-3'\ndef make(budget):\n    return 1\n")
    _write_module(modules, "vapp_plain", "class A:\n    version = ''\n")
    package = modules / "vapp_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("class A:\n    pass\n")
    assert app_version("vapp_class:A") == "2.1"
    assert app_version("vapp_module:make") == "mod-3"
    plain = app_version("vapp_plain:A")
    assert plain == source_digest(str(modules / "vapp_plain.py"))
    assert plain.startswith("src-")
    assert len(plain) == 16
    assert app_version("vapp_pkg:A") == source_digest(str(package / "__init__.py"))


@pytest.mark.timeout(60)
def test_a_session_start_without_the_app_block_reads_and_encodes_byte_for_byte_as_before() -> None:
    line = OLD_START % b"00000000"
    body = line[: line.index(b'"crc":"') + len(b'"crc":"')]
    line = OLD_START % f"{zlib.crc32(body):08x}".encode()
    start = decode_record(line.rstrip(b"\n"))
    assert isinstance(start, SessionStart)
    assert (start.app, start.app_version) == (None, None)
    assert encode_lines((start,), 0)[0] == line


@pytest.mark.timeout(60)
def test_every_epochs_session_start_names_the_stamped_app_and_verify_passes(home: Path) -> None:
    stamp_app("team_app:TeamApp", "v1")
    with Session.create(home, "s", BASELINE) as session:
        session.append(User(text="hi", key="k1"))
        session.commit_epoch("one", BASELINE)
        directory = Path(session.dir)
    for epoch in (0, 1):
        start = _start(directory / f"{epoch}.jsonl")
        assert (start.app, start.app_version) == ("team_app:TeamApp", "v1")
    first = (directory / "1.jsonl").read_bytes().splitlines()[0]
    assert first.endswith(b'"app":"team_app:TeamApp","app_version":"v1","crc":"' + first[-10:])
    assert loopd("verify", "--home", str(home)).returncode == 0


@pytest.mark.timeout(60)
def test_a_process_that_stamps_no_app_writes_the_old_form(home: Path) -> None:
    with Session.create(home, "s", BASELINE) as session:
        session.commit_epoch("one", BASELINE)
        directory = Path(session.dir)
    for epoch in (0, 1):
        assert b'"app"' not in (directory / f"{epoch}.jsonl").read_bytes()
    with Session.open(home, "s") as session:
        assert note_app_change(session, "team_app:TeamApp", "v2") is None


@pytest.mark.timeout(60)
def test_a_resume_under_another_version_appends_one_app_changed_and_a_third_follows_on(
    home: Path,
) -> None:
    stamp_app("team_app:TeamApp", "v1")
    with Session.create(home, "s", BASELINE) as session:
        session.append(User(text="hi", key="k1"))
    with Session.open(home, "s") as session:
        assert note_app_change(session, "team_app:TeamApp", "v1") is None
        assert note_app_change(session, "other:App", "v9") is None
        changed = note_app_change(session, "team_app:TeamApp", "v2")
        assert changed == {
            "app": "team_app:TeamApp", "from": "v1", "to": "v2", "epoch": 0, "line": 3,
        }  # fmt: skip
    with Session.open(home, "s") as session:
        assert note_app_change(session, "team_app:TeamApp", "v2") is None
        assert note_app_change(session, "team_app:TeamApp", "v3") is not None
        changes = [r for r in session.records if isinstance(r, AppChanged)]
        assert [(c.from_version, c.to_version) for c in changes] == [("v1", "v2"), ("v2", "v3")]
    assert loopd("verify", "--home", str(home)).returncode == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("line", "changes", "why"),
    [
        pytest.param(0, {"app": "no-colon"}, "an App is a module:attribute", id="app-no-colon"),
        pytest.param(0, {"app_version": ""}, "non-empty version", id="empty-version"),
        pytest.param(2, {"from_version": "v0"}, "but the epoch was served by", id="wrong-from"),
        pytest.param(2, {"to_version": "v1"}, "not another version", id="same-version"),
    ],
)
def test_open_and_verify_refuse_an_app_record_that_does_not_follow_on(
    home: Path, line: int, changes: dict[str, object], why: str
) -> None:
    stamp_app("team_app:TeamApp", "v1")
    with Session.create(home, "s", BASELINE) as session:
        session.append(User(text="hi", key="k1"))
        session.append(AppChanged(app="team_app:TeamApp", from_version="v1", to_version="v2"))
        directory = Path(session.dir)
    rewrite_line(directory / "0.jsonl", line, **changes)
    with pytest.raises(InvalidLog, match=why):
        Session.open(home, "s").close()
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1
    assert why in verified.stdout + verified.stderr


@pytest.mark.timeout(60)
def test_an_app_block_cut_in_half_is_refused_as_not_the_writers_shape(home: Path) -> None:
    stamp_app("team_app:TeamApp", "v1")
    with Session.create(home, "s", BASELINE) as session:
        directory = Path(session.dir)
    rewrite_line(directory / "0.jsonl", 0, app_version=None)
    with pytest.raises(TornLog, match="and app, app_version"):
        Session.open(home, "s").close()
    document = json.loads((directory / "0.jsonl").read_bytes().splitlines()[0])
    assert "app_version" not in document
