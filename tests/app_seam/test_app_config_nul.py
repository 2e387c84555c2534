"""A NUL byte in an ``[apps.NAME]`` string is refused in one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.support import loopd


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('cwd = "/tmp\\u0000x"\n', "[apps.x]: key 'cwd' holds a NUL byte"),
        ('path = ["/tmp", "/srv\\u0000x"]\n', "[apps.x]: key 'path' holds a NUL byte"),
        ('env = { X = "a\\u0000b" }\n', "[apps.x]: env: the value of 'X' holds a NUL byte"),
        ('env = { "X\\u0000Y" = "b" }\n', "[apps.x]: env: 'X\\x00Y' is not a usable variable name"),
    ],
    ids=["cwd", "path-entry", "env-value", "env-name"],
)
def test_a_nul_in_an_apps_string_stops_serve_in_one_line_naming_the_key(
    tmp_path: Path, toml: str, expected: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text('[apps.x]\napp = "worker.app:DefaultApp"\n' + toml)
    done = loopd("serve", "--home", str(home))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert expected in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_nul_in_an_apps_target_is_refused_naming_the_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text('[apps.x]\napp = "worker.app\\u0000:DefaultApp"\n')
    done = loopd("serve", "--home", str(home))
    assert done.returncode == 1, done.stderr
    assert "[apps.x]: key 'app' holds a NUL byte" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    "toml",
    ['app = "team\\u0000:x"\n',
     'metrics-listen = "127.0.0.1:0"\nmetrics-token-file = "/tmp/a\\u0000b"\n'],
    ids=["app", "metrics-token-file"],
)  # fmt: skip
def test_a_nul_in_a_top_level_string_of_loopd_toml_is_refused_naming_the_key(
    tmp_path: Path, toml: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text(toml)
    done = loopd("serve", "--home", str(home))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr  # was a ValueError traceback
    assert "holds a NUL byte" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
