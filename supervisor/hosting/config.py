"""``<home>/loopd.toml``: every ``serve`` option in a file, overridden by command-line flags.

A key is the option's flag without its dashes (``max-live = 500`` for ``--max-live``).
The accepted keys and their types come from the click command itself, so a new option is
configurable the day it is added. Unknown keys and ill-typed values are errors naming the
key; the merge order is default < file < environment < command line.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import click
from click.core import ParameterSource

from supervisor.errors import SupervisorError
from supervisor.hosting.apps import AppConfig, parse_apps
from supervisor.hosting.regular_file import decode_utf8, read_regular

CONFIG_NAME: Final = "loopd.toml"
MAX_CONFIG_BYTES: Final = 1 << 20
APPS_KEY: Final = "apps"
TENANTS_KEY: Final = "tenants"
"""``[tenants]``: the HTTP port's bearer tokens, read by ``supervisor/http/tokens.py``."""
BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
"""A TOML key that needs no quotes (an App's name with a dot does)."""
_EXPLICIT: Final = frozenset({ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT})


class ConfigError(SupervisorError):
    """The configuration file is unreadable, not TOML, or holds a bad key; ``<path>: <why>``."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One configurable option: its TOML key, its parameter name, what values it takes."""

    key: str
    name: str
    kind: type
    choices: tuple[str, ...] = ()
    param_type: click.ParamType[object] | None = None
    """The option's own type, so a file's value meets the same checks as a flag's (its
    range, finiteness, the shape of a URL)."""

    def check(self, value: object, path: str) -> object:
        """The value as the command expects it; ConfigError naming the key otherwise."""
        if self.kind is float and type(value) is int:
            value = float(value)
        if type(value) is not self.kind:
            raise ConfigError(
                path, f"key {self.key!r} must be {_KIND_NAMES[self.kind]}, not {value!r}"
            )
        if isinstance(value, str) and "\0" in value:
            # No path, module name or URL holds one; the OS call that gets it would raise
            # a ValueError naming no key.
            raise ConfigError(path, f"key {self.key!r} holds a NUL byte")
        if self.choices and value not in self.choices:
            raise ConfigError(path, f"key {self.key!r} must be one of {', '.join(self.choices)}")
        if self.param_type is None:
            return value
        try:
            return self.param_type.convert(value, None, None)
        except click.BadParameter as exc:
            raise ConfigError(path, f"key {self.key!r}: {exc.message}") from exc


_KIND_NAMES: Final[dict[type, str]] = {
    int: "an integer", float: "a number", str: "a string", bool: "true or false",
}  # fmt: skip


def option_specs(command: click.Command, *, exclude: frozenset[str]) -> dict[str, OptionSpec]:
    """The options of ``command`` a file may set, by TOML key (``exclude``: parameter names)."""
    specs: dict[str, OptionSpec] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.name is None or param.name in exclude:
            continue
        long_flags = [f for f in param.opts if f.startswith("--")]
        key = long_flags[0][2:] if long_flags else param.name.replace("_", "-")
        choices: tuple[str, ...] = ()
        kind: type
        if param.is_flag:
            kind = bool
        elif isinstance(param.type, click.Choice):
            kind, choices = str, tuple(str(c) for c in param.type.choices)
        elif isinstance(param.type, click.types.IntParamType):
            kind = int
        elif isinstance(param.type, click.types.FloatParamType):
            kind = float
        else:
            kind = str
        checked = None if param.is_flag or choices else param.type
        specs[key] = OptionSpec(key, param.name, kind, choices, checked)
    return specs


def read_table(path: str) -> dict[str, object] | None:
    """The file as a TOML table; None if there is no file; ConfigError if unusable."""
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError(path, f"cannot read: {exc.strerror}") from exc
    if raw is None:
        return None
    try:
        table = tomllib.loads(decode_utf8(raw))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, f"not TOML: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(path, str(exc)) from exc
    except RecursionError as exc:
        raise ConfigError(path, "not TOML loopd can read: nested too deeply") from exc
    return table


def read_config(path: str, specs: Mapping[str, OptionSpec]) -> dict[str, object]:
    """The file's values by parameter name; an absent file sets nothing."""
    table = read_table(path)
    if table is None:
        return {}
    values: dict[str, object] = {}
    for key, value in table.items():
        if key in (APPS_KEY, TENANTS_KEY):
            continue  # [apps.NAME] tables: read_apps; [tenants]: the HTTP port's tokens
        spec = specs.get(key)
        if spec is None:
            raise ConfigError(path, f"unknown key {key!r} (known: {', '.join(sorted(specs))})")
        values[spec.name] = spec.check(value, path)
    return values


def read_apps(path: str) -> dict[str, AppConfig]:
    """The file's named Apps (``[apps.NAME]``); none if the file or the table is absent."""
    table = read_table(path)
    if table is None or APPS_KEY not in table:
        return {}
    return parse_apps(table[APPS_KEY], path)


def merge_config(
    ctx: click.Context, params: Mapping[str, object], specs: Mapping[str, OptionSpec], path: str
) -> dict[str, object]:
    """The command's parameters with the file applied under the flags that were given."""
    merged = dict(params)
    for name, value in read_config(path, specs).items():
        if ctx.get_parameter_source(name) not in _EXPLICIT:
            merged[name] = value
    return merged


def config_path(home: str) -> str:
    return os.path.join(home, CONFIG_NAME)


def render_config(
    values: Mapping[str, object],
    specs: Mapping[str, OptionSpec],
    apps: Mapping[str, AppConfig] | None = None,
) -> str:
    """The merged settings, then the named Apps, as a TOML document that reads back to
    the same values and Apps."""
    lines = []
    for key, spec in sorted(specs.items()):
        value = values.get(spec.name)
        if value is None:
            lines.append(f"# {key} is unset")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int | float):
            lines.append(f"{key} = {value!r}")
        else:
            lines.append(f"{key} = {_string(str(value))}")
    for name, app in sorted((apps or {}).items()):
        bare = BARE_KEY.fullmatch(name) is not None
        lines += ["", f"[{APPS_KEY}.{name if bare else _string(name)}]", *_app_lines(app)]
    return "\n".join(lines) + "\n"


def _app_lines(app: AppConfig) -> list[str]:
    """An App's keys as ``parse_apps`` reads them; what is unset is left out."""
    env = ", ".join(f"{_string(k)} = {_string(v)}" for k, v in sorted(app.env.items()))
    keys: list[tuple[str, str | None]] = [
        ("app", _string(app.target)),
        ("path", f"[{', '.join(_string(p) for p in app.path)}]" if app.path else None),
        ("cwd", None if app.cwd is None else _string(app.cwd)),
        ("env", f"{{ {env} }}" if app.env else None),
        ("budget", None if app.budget is None else str(app.budget)),
        ("hang-timeout", None if app.hang_timeout is None else repr(app.hang_timeout)),
        ("request-deadline", None if app.request_deadline is None else repr(app.request_deadline)),
    ]
    return [f"{key} = {value}" for key, value in keys if value is not None]


def _string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's quoting once DEL (raw in JSON, not in TOML)
    is escaped; non-ASCII stays raw, as JSON's surrogate pairs are not TOML."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
