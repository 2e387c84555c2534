"""loopd.toml: read with tomllib, unknown keys refused by name, flags win over the file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from supervisor.hosting.config import (
    ConfigError,
    config_path,
    merge_config,
    option_specs,
    read_config,
    render_config,
)


@click.command()
@click.option("--home", required=True)
@click.option("--max-live", type=click.IntRange(min=1), default=None)
@click.option("--idle-stop", type=float, default=None)
@click.option("--start-method", type=click.Choice(["fork", "exec"]), default="fork")
@click.option("--app", default=None)
@click.option("--verbose", is_flag=True)
@click.pass_context
def toy(ctx: click.Context, /, home: str, **params: object) -> None:
    specs = option_specs(toy, exclude=frozenset({"home"}))
    click.echo(render_config(merge_config(ctx, params, specs, config_path(home)), specs), nl=False)


SPECS = option_specs(toy, exclude=frozenset({"home"}))


def run(home: Path, *flags: str) -> click.testing.Result:
    return CliRunner().invoke(toy, ["--home", str(home), *flags])


def test_file_values_apply_and_command_line_flags_override_them(tmp_path: Path) -> None:
    (tmp_path / "loopd.toml").write_text('max-live = 500\nidle-stop = 30\napp = "m:a"\n')
    result = run(tmp_path, "--max-live", "7")
    assert result.exit_code == 0, result.output
    printed = tomllib.loads(result.output)
    assert printed == {"max-live": 7, "idle-stop": 30.0, "app": "m:a", "start-method": "fork",
                       "verbose": False}  # fmt: skip


def test_the_printed_config_reads_back_to_the_same_values(tmp_path: Path) -> None:
    (tmp_path / "loopd.toml").write_text('app = "a \\"quoted\\" é"\nverbose = true\n')
    once = run(tmp_path).output
    (tmp_path / "loopd.toml").write_text(once)
    assert run(tmp_path).output == once


def test_an_unknown_key_is_refused_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "loopd.toml").write_text("max_live = 3\n")
    with pytest.raises(ConfigError, match=r"loopd\.toml: unknown key 'max_live'"):
        read_config(str(tmp_path / "loopd.toml"), SPECS)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param('max-live = "many"', "key 'max-live' must be an integer", id="int"),
        pytest.param("max-live = true", "key 'max-live' must be an integer", id="bool-for-int"),
        pytest.param('start-method = "spawn"', "must be one of fork, exec", id="choice"),
        pytest.param("max-live = ", "not TOML", id="syntax"),
        pytest.param("max-live = 0", r"key 'max-live': 0 is not in the range x>=1", id="range"),
    ],
)
def test_an_ill_typed_value_is_refused_naming_the_key(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "loopd.toml").write_text(text + "\n")
    with pytest.raises(ConfigError, match=why):
        read_config(str(tmp_path / "loopd.toml"), SPECS)


def test_an_absent_file_sets_nothing(tmp_path: Path) -> None:
    assert read_config(str(tmp_path / "loopd.toml"), SPECS) == {}
