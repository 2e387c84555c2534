"""The ``loopd`` operator CLI: one click group whose commands load only when used.

``loopd serve`` should not pay for the demo or the chaos rig, and forked workers
inherit whatever the supervisor has loaded, so each command is imported on demand.
Packages above supervisor (the chaos rig) add their command groups through the
``loopd.commands`` entry point, so that supervisor never imports them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Final, NoReturn

import click

PLUGIN_GROUP: Final = "loopd.commands"
COMMANDS: Final = {
    "serve": "supervisor.cli.serve_command:serve",
    "create": "supervisor.cli.create_command:create",
    "send": "supervisor.cli.daemon_commands:send",
    "schedule": "supervisor.cli.schedule_command:schedule",
    "compact": "supervisor.cli.daemon_commands:compact",
    "start": "supervisor.cli.daemon_commands:start",
    "stop": "supervisor.cli.daemon_commands:stop",
    "restart": "supervisor.cli.ops_commands:restart",
    "upgrade": "supervisor.cli.upgrade_command:upgrade",
    "status": "supervisor.cli.daemon_commands:status",
    "top": "supervisor.cli.ops_commands:top",
    "systemd-unit": "supervisor.cli.ops_commands:systemd_unit",
    "inspect": "supervisor.cli.offline_commands:inspect",
    "verify": "supervisor.cli.offline_commands:verify",
    "repair": "supervisor.cli.offline_commands:repair",
    "salvage": "supervisor.cli.salvage_command:salvage",
    "backup": "supervisor.cli.backup_commands:backup",
    "restore": "supervisor.cli.backup_commands:restore",
    "fork": "supervisor.cli.fork_command:fork",
    "delete": "supervisor.cli.removal_commands:delete",
    "forget": "supervisor.cli.removal_commands:forget",
    "logs": "supervisor.cli.log_commands:logs",
    "tail": "supervisor.cli.tail_command:tail",
    "events": "supervisor.cli.stream_commands:events",
    "metrics": "supervisor.cli.stream_commands:metrics",
    "demo": "supervisor.cli.demo_command:demo",
    "move": "supervisor.cli.cluster_commands:move",
    "drain": "supervisor.cli.cluster_commands:drain",
    "cordon": "supervisor.cli.cluster_commands:cordon_command",
    "uncordon": "supervisor.cli.cluster_commands:uncordon_command",
    "takeover": "supervisor.cli.cluster_commands:takeover",
}


EXIT_USAGE: Final = 2


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is asked for.

    A usage error (a bad flag, a value out of range, nan for a number) is one line on
    stderr, ``loopd CMD: <what was wrong>``, exit 2, as every other error of loopd is;
    ``loopd CMD --help`` shows the usage.
    """

    def main(  # type: ignore[override]  # click's overloads; this one always exits
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: object
    ) -> NoReturn:
        try:
            result = super().main(args, prog_name, standalone_mode=False, **extra)  # type: ignore[call-overload]
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "loopd"
            click.echo(f"{where}: {exc.format_message()}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        from importlib.metadata import entry_points  # noqa: PLC0415 - slow: only when listed

        plugins = [entry.name for entry in entry_points(group=PLUGIN_GROUP)]
        return sorted({*COMMANDS, *plugins})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        try:
            if target is not None:
                module, _, attribute = target.partition(":")
                command = getattr(importlib.import_module(module), attribute)
            else:
                from importlib.metadata import entry_points  # noqa: PLC0415 - a plugin only

                found = [e for e in entry_points(group=PLUGIN_GROUP) if e.name == cmd_name]
                if not found:
                    return None
                target = found[0].value
                command = found[0].load()
        except Exception as exc:  # noqa: BLE001 - any failure to load is reported the same way
            return _unloadable(cmd_name, target or cmd_name, exc)
        if not isinstance(command, click.Command):
            return _unloadable(cmd_name, target or cmd_name, TypeError("not a click command"))
        return command


def _unloadable(name: str, target: str, exc: BaseException) -> click.Command:
    """A command whose module does not load (a broken plugin, a damaged install): listed
    by ``loopd --help`` with why, and one line on stderr, exit 1, when it is run; the
    other commands are untouched."""
    why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]

    def refuse() -> None:
        click.echo(f"loopd {name}: the command does not load ({target}): {why}", err=True)
        sys.exit(1)

    return click.Command(
        name,
        callback=refuse,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=f"(does not load: {why})",
        short_help=f"(does not load: {why})"[:80],
        add_help_option=False,
    )


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loopd")
def main() -> None:
    """loopd: host many long-lived sessions without losing or corrupting their state."""
