"""A template watches the files its App's import read, as it watches the App's modules
(docs/templates.md, "What a template watches"): a prompt changed on disk reaches the next
worker as it reaches a worker that imports the App itself; what the import wrote, and
bytecode, never make a template stale."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from supervisor.client import Client, call
from supervisor.templates.watched_files import MAX_READ_FILES
from tests.harness.support import (
    REPO,
    importers,
    ready_templates,
    running_daemon,
    status,
    wait_state,
)

pytestmark = pytest.mark.timeout(180)

_PROMPTED = """
import os
from pathlib import Path

from worker.app import DefaultApp

with open(os.environ["LOOPD_TEST_IMPORTS"], "a", encoding="utf-8") as counter:
    counter.write(f"{os.getpid()}\\n")  # a file the import only wrote: never watched
PROMPT = Path("prompt.txt").read_text(encoding="utf-8")  # relative: the App's cwd


class PromptApp(DefaultApp):
    def handle(self, session, request):
        return {**super().handle(session, request), "prompt": PROMPT}
"""


def _write(path: Path, text: str, mtime: int) -> None:
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(mtime, mtime))  # a distinct mtime, however coarse the clock


def _named_app(home: Path, app_dir: Path, app: str, counter: Path) -> None:
    home.mkdir()
    (home / "loopd.toml").write_text(
        f'[apps.named]\napp = "{app}"\ncwd = "{app_dir}"\n'
        f'env = {{ LOOPD_TEST_IMPORTS = "{counter}" }}\n'
    )


def _answer(home: Path, client: Client, session: str, key: str) -> tuple[dict[str, object], int]:
    reply = client.send(session, f"hello {key}", key=key)
    return reply, int(str(status(home, session)["pid"]))


def test_a_data_file_changed_after_the_template_was_ready_reaches_the_next_worker(
    tmp_path: Path,
) -> None:
    """The App reads prompt.txt at import. Changed on disk, the next worker start's order
    is refused (the file named in serve's output), that worker imports the App itself and
    answers with the new prompt, and a new template forks the workers after it."""
    home, app_dir, counter = tmp_path / "home", tmp_path / "app", tmp_path / "imports"
    app_dir.mkdir()
    (app_dir / "prompted_app.py").write_text(_PROMPTED)
    prompt = app_dir / "prompt.txt"
    _write(prompt, "v1", 1_000_000_000_000_000_000)
    _named_app(home, app_dir, "prompted_app:PromptApp", counter)
    with running_daemon(home) as daemon, Client(str(home), timeout=60) as client:
        [first] = ready_templates(daemon)
        call(str(home), "create", session="s1", app="named", timeout=60)
        reply, s1 = _answer(home, client, "s1", "k1")
        assert reply["prompt"] == "v1"
        assert first in importers(counter)
        assert s1 not in importers(counter), "the first worker did not come from the template"
        _write(prompt, "v2", 2_000_000_000_000_000_000)
        call(str(home), "restart", session="s1", timeout=60)
        wait_state(home, "s1", "RUNNING")
        reply, _pid = _answer(home, client, "s1", "k2")
        assert reply["prompt"] == "v2"
        log = daemon.log_path.read_text(errors="replace")
        assert f"template of App prompted_app:PromptApp (cwd {app_dir}): {prompt} changed" in log
        second = ready_templates(daemon, 2)[1]
        assert second != first
        call(str(home), "create", session="s2", app="named", timeout=60)
        reply, s2 = _answer(home, client, "s2", "k3")
        assert reply["prompt"] == "v2"
        assert s2 not in importers(counter), "the new template did not fork the next worker"


_WRITING = """
import os
from pathlib import Path

import compiled_helper  # read from the bytecode the test compiled for it
from worker.app import DefaultApp

with open(os.environ["LOOPD_TEST_IMPORTS"], "a", encoding="utf-8") as counter:
    counter.write(f"{os.getpid()}\\n")
Path("written.txt").write_text(f"written by {os.getpid()}", encoding="utf-8")
_own = Path("own-cache.txt")  # written, then read back: the App's own output
_own.write_text("cached", encoding="utf-8")
CACHED = _own.read_text(encoding="utf-8")


class WritingApp(DefaultApp):
    def handle(self, session, request):
        return {**super().handle(session, request), "helper": compiled_helper.VALUE}
"""


def test_files_the_import_wrote_and_bytecode_never_make_its_template_stale(
    tmp_path: Path,
) -> None:
    """The import writes files (one it reads back), writes the bytecode of its module and
    reads its helper's; all are rewritten after the template was ready, and every worker
    still comes from that one template."""
    home, app_dir, counter = tmp_path / "home", tmp_path / "app", tmp_path / "imports"
    app_dir.mkdir()
    (app_dir / "writing_app.py").write_text(_WRITING)
    helper = app_dir / "compiled_helper.py"
    _write(helper, 'VALUE = "helper"\n', 1_000_000_000_000_000_000)
    written = py_compile.compile(str(helper), doraise=True)
    assert written is not None
    compiled = Path(written)
    _named_app(home, app_dir, "writing_app:WritingApp", counter)
    env = {"PYTHONDONTWRITEBYTECODE": ""}  # the template's import writes its bytecode
    with running_daemon(home, env=env) as daemon, Client(str(home), timeout=60) as client:
        [template] = ready_templates(daemon)
        assert (app_dir / "__pycache__").is_dir()
        workers = []
        for n, session in enumerate(["s1", "s2", "s3"]):
            call(str(home), "create", session=session, app="named", timeout=60)
            reply, pid = _answer(home, client, session, f"k{n}")
            assert reply["helper"] == "helper"
            workers.append(pid)
            later = 2_000_000_000_000_000_000 + n
            py_compile.compile(str(helper), doraise=True)  # same source, a new .pyc
            for path in (compiled, app_dir / "written.txt", app_dir / "own-cache.txt"):
                os.utime(path, ns=(later, later))
        assert template in importers(counter)
        assert not set(workers) & importers(counter), "a worker imported the App itself"
        assert [p.pid for p in daemon.templates()] == [template]
        assert "changed since its import" not in daemon.log_path.read_text(errors="replace")


_READING_MANY = """
import os
from pathlib import Path

from worker.app import DefaultApp

with open(os.environ["LOOPD_TEST_IMPORTS"], "a", encoding="utf-8") as counter:
    counter.write(f"{os.getpid()}\\n")
SHARDS = [path.read_text(encoding="utf-8") for path in sorted(Path("shards").iterdir())]


class ManyApp(DefaultApp):
    def handle(self, session, request):
        return {**super().handle(session, request), "shards": len(SHARDS)}
"""


def test_an_import_that_reads_past_the_bound_keeps_its_template_and_serve_says_so(
    tmp_path: Path,
) -> None:
    home, app_dir, counter = tmp_path / "home", tmp_path / "app", tmp_path / "imports"
    (app_dir / "shards").mkdir(parents=True)
    (app_dir / "many_app.py").write_text(_READING_MANY)
    for n in range(MAX_READ_FILES + 3):
        (app_dir / "shards" / f"{n:05}").write_text(str(n))
    _named_app(home, app_dir, "many_app:ManyApp", counter)
    with running_daemon(home) as daemon, Client(str(home), timeout=60) as client:
        [template] = ready_templates(daemon)
        log = daemon.log_path.read_text(errors="replace")
        assert f"its import read more than {MAX_READ_FILES} files: the first" in log
        (app_dir / "shards" / f"{MAX_READ_FILES + 2:05}").write_text("past the bound")
        call(str(home), "create", session="s1", app="named", timeout=60)
        reply, pid = _answer(home, client, "s1", "k1")
        assert reply["shards"] == MAX_READ_FILES + 3
        assert pid not in importers(counter), "the template was not used"
        assert [p.pid for p in daemon.templates()] == [template]


_RECORD = """
import json, os, sys, time
from pathlib import Path
from supervisor.templates.watched_files import (
    MAX_READ_FILES, ImportReads, files_clock_ns, first_changed, recording_reads,
    watched_files)

root = Path(sys.argv[1])
(root / "sub").mkdir()
for name in ("a.txt", "sub/b.txt", "late.txt", "gone.txt", "written.txt", "own.txt"):
    (root / name).write_text(name)
os.mkfifo(root / "fifo")
many = root / "many"
many.mkdir()
for n in range(MAX_READ_FILES + 5):
    (many / str(n)).write_text("")
reads = ImportReads()
os.chdir(root)
latest = max(p.stat().st_ctime_ns for p in [*root.rglob("*")])
while files_clock_ns() <= latest:  # the files' own tick past: made before the import
    pass
began = files_clock_ns()
with recording_reads(reads):
    open("a.txt").close()
    os.chdir("sub")
    open("b.txt").close()  # relative to the working directory of this open
    os.chdir(root)
    open("/proc/self/status").close()
    open("/dev/null").close()
    os.close(os.open("fifo", os.O_RDONLY | os.O_NONBLOCK))
    os.close(os.open(".", os.O_RDONLY))
    open(os.open("a.txt", os.O_RDONLY)).close()
    open("written.txt", "w").close()
    open("own.txt").close()
    open("own.txt", "r+").close()  # read, and written: the App's own
    open("gone.txt").close()
    open("x.pyc", "a").close()
    os.makedirs("__pycache__")
    open("__pycache__/c.txt", "w").close()
    open("__pycache__/c.txt").close()
    now = time.time_ns()
    os.utime("late.txt", ns=(now, now))  # changed while the import ran
    open("late.txt").close()
    for n in range(MAX_READ_FILES + 5):
        open(many / str(n)).close()
    (root / "gone.txt").unlink()
open("sub/b.txt").close()  # after the import: not recorded
files = watched_files(set(), reads, began)
inside = [p for p, m in files.items() if m is None]
changed = first_changed(files)
del files[str(root / "late.txt")]
os.unlink("a.txt")
print(json.dumps({
    "read": [p for p in reads.read if "/many/" not in p], "written": sorted(reads.written),
    "watched": [p for p in files if "/many/" not in p],
    "many": sum("/many/" in p for p in files), "unwatched": reads.unwatched,
    "past": reads.past_bound(), "inside": inside, "changed": changed,
    "gone": first_changed(files),
}))
"""


def _in_own_process(script: str, root: Path) -> dict[str, Any]:
    """Run ``script`` on a fresh directory ``root`` in a process of its own (an audit hook
    is never removed); what it printed, as JSON."""
    root.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(root)],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_reads_recorded_are_regular_files_by_absolute_path_and_bounded(
    tmp_path: Path,
) -> None:
    """In a process of its own: an audit hook is never removed."""
    root = tmp_path / "root"
    seen = _in_own_process(_RECORD, root)
    read = ["a.txt", "sub/b.txt", "fifo", "", "own.txt", "gone.txt", "late.txt"]
    assert seen["read"] == [str(root / name) if name else str(root) for name in read]
    assert seen["written"] == [str(root / "own.txt"), str(root / "written.txt")]
    # gone.txt, read then removed while the import ran: watched for its coming back
    assert seen["watched"] == [str(root / n) for n in ("a.txt", "sub/b.txt", "gone.txt")]
    assert seen["many"] == MAX_READ_FILES - len(read)
    assert seen["unwatched"] == 5 + len(read)
    assert f"more than {MAX_READ_FILES} files" in seen["past"]
    assert seen["inside"] == [str(root / "late.txt")]
    assert seen["changed"] == str(root / "late.txt")
    assert seen["gone"] == str(root / "a.txt")


_MOVES = """
import json, os, subprocess, sys
from pathlib import Path
from supervisor.templates.order import Said, SaidKind
from supervisor.templates.watched_files import (
    ImportReads, files_clock_ns, first_changed, printable, recording_reads, watched_files)

root = Path(sys.argv[1])
os.chdir(root)
for name in ("deploy.txt", "staged.txt", "kept.txt"):
    Path(name).write_text(name)
odd = os.fsdecode(b"odd-\\xff.txt")
Path(odd).write_text("odd")
os.utime("staged.txt", ns=(1, 1))  # staged long ago: an archive's, or cp -p's, dates
latest = max(p.stat().st_ctime_ns for p in root.iterdir())
while files_clock_ns() <= latest:  # the files' own tick past: made before the import
    pass
reads = ImportReads()
began = files_clock_ns()
with recording_reads(reads):
    for name in ("deploy.txt", "kept.txt", odd):
        open(name).close()
    try:
        open("optional.txt").close()  # an override it looks for, not there
    except FileNotFoundError:
        pass
    # A deploy renames its staged file into place while the import runs (another process).
    subprocess.run(["mv", "staged.txt", "deploy.txt"], check=True)
    # The App's own: built beside, put in place, read back.
    Path("bundle.tmp").write_text("{}")
    os.replace("bundle.tmp", "bundle.json")
    open("bundle.json").close()
files = watched_files(set(), reads, began)
first = first_changed(files)
mtime = os.stat(odd).st_mtime_ns
Path(odd).write_text("odd, changed")
os.utime(odd, ns=(mtime, mtime))  # its mtime as it was (cp -p): its ctime still tells
stale = Said(kind=SaidKind.STALE, text=printable(odd)).encode()
optional = {str(root / "optional.txt"): files[str(root / "optional.txt")]}
before = first_changed(optional)
Path("optional.txt").write_text("an override")
print(json.dumps({
    "watched": sorted(files), "inside": [p for p, f in files.items() if f is None],
    "first": first, "then": first_changed({p: f for p, f in files.items() if f is not None}),
    "said": Said.decode(stale).text,
    "raw_encodes": len(Said(kind=SaidKind.STALE, text=odd).encode()) > 0,
    "optional": [before, first_changed(optional)],
}))
"""


def test_a_file_renamed_in_during_the_import_or_rewritten_with_its_old_mtime_is_changed(
    tmp_path: Path,
) -> None:
    """Files are told by inode and ctime, not the mtime alone; a file the import put in
    place itself (``os.replace``) is its own output, not watched; one it looked for and
    did not find is watched for its coming; a name that is no UTF-8 is said escaped (it
    made the template's answer fail to encode)."""
    root = tmp_path / "root"
    seen = _in_own_process(_MOVES, root)
    odd = os.fsdecode(str(root).encode() + b"/odd-\xff.txt")
    watched = [str(root / "deploy.txt"), str(root / "kept.txt"), odd, str(root / "optional.txt")]
    assert seen["watched"] == sorted(watched)
    assert seen["inside"] == [str(root / "deploy.txt")]  # its ctime: the rename's
    assert seen["first"] == str(root / "deploy.txt")
    assert seen["then"] == odd  # rewritten, its mtime set back: its ctime moved
    assert seen["said"] == "odd-\\xff.txt"  # the byte escaped, the rest as it is
    assert seen["raw_encodes"]
    # Looked for and not there: unchanged while it stays away, changed once it comes.
    assert seen["optional"] == [None, str(root / "optional.txt")]
