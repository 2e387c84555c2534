"""Operator tools say what they drop or why they refuse: ``restore --force`` lists the
work acknowledged after the backup and replaces only on confirmation of that set,
``repair --rebuild-baseline`` uses the App the session was created with (its named App,
from the intent), and ``delete`` of a session with no directory points to ``forget``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.harness.support import log_user_keys, loopd
from worker import Assistant, Baseline, Session, User
from worker.app import DefaultApp

NAMED_APP = '''
import os
from worker import Baseline
from worker.app import DefaultApp

class NamedApp(DefaultApp):
    """Its initial baseline is its own: made from its environment, not the default's."""

    def initial_baseline(self, session_id):
        return Baseline(system="named " + os.environ["LOOPD_TEST_TAG"], memory=session_id)
'''


def _session(home: Path, name: str, keys: list[str]) -> None:
    with Session.create(home, name, DefaultApp().initial_baseline(name)) as session:
        for key in keys:
            session.append_many([User(text=f"about {key}", key=key), Assistant(text="a")])


def _append(home: Path, name: str, keys: list[str]) -> None:
    with Session.open(home, name) as session:
        for key in keys:
            session.append_many([User(text=f"about {key}", key=key), Assistant(text="a")])


def test_restore_force_over_later_work_lists_it_and_replaces_only_when_that_set_is_confirmed(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    _session(home, "s", ["k1", "k2"])
    done = loopd("backup", "--home", str(home), "s", str(dest))
    assert done.returncode == 0, done.stderr
    _append(home, "s", ["k3", "k4"])  # acknowledged after the backup's point
    refused = loopd("restore", "--home", str(home), str(dest / "s"), "--force")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "k3\n" in refused.stdout
    assert "k4\n" in refused.stdout
    assert "k1" not in refused.stdout
    assert "4 records (2 keys)" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1
    token = re.findall(r"--force --dropping ([0-9a-f]+)", refused.stderr)[0]
    assert log_user_keys(home, "s") == ["k1", "k2", "k3", "k4"]  # nothing changed
    _append(home, "s", ["k5"])  # more work since the listing: the token is not for it
    stale = loopd("restore", "--home", str(home), str(dest / "s"), "--force", "--dropping", token)
    assert stale.returncode == 1
    assert "k5\n" in stale.stdout
    assert log_user_keys(home, "s") == ["k1", "k2", "k3", "k4", "k5"]
    token = re.findall(r"--force --dropping ([0-9a-f]+)", stale.stderr)[0]
    said = loopd("restore", "--home", str(home), str(dest / "s"), "--force", "--dropping", token)
    assert said.returncode == 0, said.stderr
    assert "dropped 6 records (3 keys) acknowledged after the backup's point" in said.stdout
    assert log_user_keys(home, "s") == ["k1", "k2"]
    # Nothing acknowledged after the backup: --force alone replaces.
    again = loopd("restore", "--home", str(home), str(dest / "s"), "--force")
    assert again.returncode == 0, again.stderr


def test_rebuild_baseline_uses_the_named_app_the_session_was_created_with(
    tmp_path: Path,
) -> None:
    home, source = tmp_path / "home", tmp_path / "appsrc"
    source.mkdir()
    (source / "named_app.py").write_text(NAMED_APP)
    home.mkdir()
    (home / "loopd.toml").write_text(
        f'[apps.named]\napp = "named_app:NamedApp"\npath = [{str(source)!r}]\n'
        'env = { LOOPD_TEST_TAG = "blue" }\n'
    )
    with Session.create(home, "agent", Baseline(system="named blue", memory="agent")):
        pass
    (home / "intent.json").write_text('{"stopped":["agent"],"apps":{"agent":"named"}}\n')
    baseline = home / "sessions" / "agent" / "0.baseline.json"
    original = baseline.read_bytes()
    baseline.unlink()
    other = loopd("repair", "--rebuild-baseline", "--app", "worker.app:DefaultApp",
                  "--home", str(home), "agent")  # fmt: skip
    assert other.returncode == 2, other.stdout + other.stderr
    assert "was created with the App 'named'" in other.stderr
    assert other.stderr.count("\n") == 1
    said = loopd("repair", "--rebuild-baseline", "--home", str(home), "agent")
    assert said.returncode == 0, said.stdout + said.stderr
    assert "app 'named' (named_app:NamedApp)" in said.stdout
    assert baseline.read_bytes() == original
    # A named App loopd.toml no longer names is refused in one line, nothing written.
    baseline.unlink()
    (home / "loopd.toml").write_text("")
    gone = loopd("repair", "--rebuild-baseline", "--home", str(home), "agent")
    assert gone.returncode == 2
    assert "loopd.toml's [apps] does not name it" in gone.stderr
    assert gone.stderr.count("\n") == 1
    assert not baseline.exists()


def test_delete_of_a_session_with_no_directory_points_to_forget(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)
    (home / "intent.json").write_text('{"stopped":["s1"],"apps":{"s1":"x"}}\n')
    done = loopd("delete", "--home", str(home), "s1")
    assert done.returncode == 1
    assert "loopd forget --home" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
    assert (home / "intent.json").read_text() == '{"stopped":["s1"],"apps":{"s1":"x"}}\n'
