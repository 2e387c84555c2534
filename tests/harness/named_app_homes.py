"""A home whose loopd.toml names an App importable only from its own path (named-App tests)."""

from __future__ import annotations

from pathlib import Path

TAGGED_APP = '''
import os
from worker.app import DefaultApp

class TaggedApp(DefaultApp):
    """Answers with where it runs: its tag (env), its working directory, its budget."""

    def handle(self, session, request):
        result = super().handle(session, request)
        result["tag"] = os.environ.get("LOOPD_TEST_TAG")
        result["cwd"] = os.getcwd()
        result["budget"] = self.budget
        return result
'''


def home_with_apps(tmp_path: Path) -> tuple[Path, Path]:
    """A home whose loopd.toml names the App ``tagged``, importable only from its path."""
    source, work, home = tmp_path / "appsrc", tmp_path / "work", tmp_path / "home"
    source.mkdir()
    work.mkdir()
    home.mkdir()
    (source / "tagged_app.py").write_text(TAGGED_APP)
    (home / "loopd.toml").write_text(
        "[apps.tagged]\n"
        'app = "tagged_app:TaggedApp"\n'
        f"path = [{str(source)!r}]\n"
        f"cwd = {str(work)!r}\n"
        'env = { LOOPD_TEST_TAG = "blue" }\n'
        "budget = 123456\n"
    )
    return home, work
