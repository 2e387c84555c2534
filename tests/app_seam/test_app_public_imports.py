"""The App author's imports: one public place (``worker.app``), and the old paths warned.

docs/apps.md lists the public names as one ``from worker.app import (...)`` block; the
test runs that block as written and holds it to ``worker.app.__all__``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import worker.app
from tests.harness.support import REPO
from worker.app import turn
from worker.store.baseline import Baseline
from worker.store.session import Session

GUIDE = REPO / "docs" / "apps.md"
# Where each name lived before worker/store/ (an App of last month imports it from there).
OLD_PATHS = {
    "worker.baseline": "Baseline",
    "worker.records": "User",
    "worker.session": "Session",
    "worker.errors": "SessionError",
}


def _public_block() -> str:
    found = re.search(
        r"```python\n(from worker\.app import \(\n.*?\))\n```", GUIDE.read_text(), re.S
    )
    assert found, "docs/apps.md lists no public 'from worker.app import (...)' block"
    return found.group(1)


def test_every_name_the_guide_lists_as_public_imports_from_worker_app() -> None:
    names: dict[str, object] = {}
    exec(_public_block(), names)  # noqa: S102 - the guide's own import block, as written
    listed = sorted(name for name in names if name != "__builtins__")
    assert listed == sorted(worker.app.__all__)
    for name in listed:
        assert names[name] is getattr(worker.app, name), name


def test_the_public_names_are_the_ones_the_worker_uses() -> None:
    assert worker.app.Baseline is Baseline
    assert worker.app.Session is Session
    assert worker.app.progress is turn.progress
    assert worker.app.stream is turn.stream


@pytest.mark.parametrize(("old", "name"), sorted(OLD_PATHS.items()), ids=sorted(OLD_PATHS))
def test_an_old_import_path_still_imports_with_a_deprecation_warning_naming_worker_app(
    monkeypatch: pytest.MonkeyPatch, old: str, name: str
) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)  # the warning is at first import
    with pytest.warns(
        DeprecationWarning, match=rf"{re.escape(old)} is deprecated.*worker\.app"
    ) as seen:
        module = __import__(old, fromlist=[name])  # an import statement, as an App has it
    assert getattr(module, name) is getattr(worker.app, name)
    assert [w.filename for w in seen] == [__file__]  # the importer's line, not importlib's


def test_an_app_importing_an_old_path_is_warned_in_its_workers_output_by_default(
    tmp_path: Path,
) -> None:
    (tmp_path / "old_app.py").write_text(
        "from worker.baseline import Baseline\n"
        "from worker.app import DefaultApp\n"
        "def make(budget):\n"
        "    assert Baseline\n"
        "    return DefaultApp(budget)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONPATH")}
    ran = subprocess.run(
        [sys.executable, "-c", "from worker.app import load_app; load_app('old_app:make')"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    # Python's default filters would hide it (not triggered by __main__); load_app shows it.
    assert "old_app.py:1: DeprecationWarning: worker.baseline is deprecated" in ran.stderr
