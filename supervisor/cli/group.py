"""The ``loopd`` operator CLI: one click group whose commands load only when used.

``loopd serve`` should not pay for the demo or the chaos rig, and forked workers
inherit whatever the supervisor has loaded, so each command is imported on demand.
Packages above supervisor (the chaos rig) add their command groups through the
``loopd.commands`` entry point, so that supervisor never imports them. ``loopd --help``
lists each command with its line of ``SHORT_HELP``, without importing it (it imported
every command, the cluster code and the chaos rig: 300 ms, issue 32); a command or a
plugin without a line there is loaded for its own.
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
    "inspect": "supervisor.cli.offline.offline_commands:inspect",
    "verify": "supervisor.cli.offline.offline_commands:verify",
    "repair": "supervisor.cli.offline.offline_commands:repair",
    "salvage": "supervisor.cli.offline.salvage_command:salvage",
    "backup": "supervisor.cli.backup_commands:backup",
    "restore": "supervisor.cli.backup_commands:restore",
    "fork": "supervisor.cli.offline.fork_command:fork",
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

# Each command's short help, as ``loopd --help`` shows it: the first sentence of its
# docstring (tests/cli/test_cli_help_lines.py checks each against the command's own). The
# rig's group is named here too: it ships in this distribution, and its line is all
# that --help needs of it.
SHORT_HELP: Final = {
    "backup": "Copy session ID (or --all) into DEST/ID, consistently, while it runs.",
    "chaos": "The crash rig: kill workers at every write boundary and check the files.",
    "compact": "Close session ID's epoch now and start the next one.",
    "cordon": "Place no new session on NODE (its sessions stay; `drain` moves them).",
    "create": "Create session ID and start its worker (with --cluster: on the least loaded node).",
    "delete": "Stop session ID, move its directory to <home>/trash/, and forget it.",
    "demo": "Show loopd's guarantees on a temporary home; exit 0 only if every check held.",
    "drain": "Cordon NODE, then move every session of it to the other live nodes.",
    "events": "Print every session's state changes as they happen, one line each, until ^C.",
    "forget": "Stop listing session ID, whose directory was moved out of <home>/sessions/.",
    "fork": "Make NEW a session whose history is ID's up to the end of epoch E.",
    "inspect": "Show a session's epochs, record counts, carry and next_call (read-only).",
    "logs": "Print the last lines of session ID's worker output (stdout and stderr).",
    "metrics": "Print the supervisor's metrics in the Prometheus text exposition format.",
    "move": "Move a session to another node (a rerun finishes an interrupted move).",
    "repair": "Move a damaged last group of ID's newest log into <home>/quarantine/ID/.",
    "restart": "Stop, then start, session ID's worker; with --all, every running session's.",
    "restore": "Put back the backup SRC (or SRC/ID of a --all backup) as a session of the home.",
    "salvage": "Cut session ID back to the longest prefix that opens; quarantine the rest.",
    "schedule": (
        "Schedule TEXT for session ID at --at (delivered once, never before), or --cancel KEY."
    ),
    "send": "Send TEXT to session ID (straight to its worker) and print the reply.",
    "serve": (
        "Run the supervisor for HOME until SIGTERM or SIGINT (then stop every worker, exit 0)."
    ),
    "start": "Start session ID's worker (also out of FATAL).",
    "status": "Show each session: state, pid, epoch, records, restarts, uptime, rss, last error.",
    "stop": "Stop session ID's worker: SIGTERM, a deadline, SIGKILL.",
    "systemd-unit": "Print the Type=notify systemd unit of docs/operations.md for HOME.",
    "tail": "Print the newest records of session ID's current epoch, from its running worker.",
    "takeover": "LOSSY: install a copy of a session whose node is gone for good (docs/scaling.md).",
    "top": "A live view of every session of HOME, refreshed every --interval (q quits).",
    "uncordon": "Place new sessions on NODE again.",
    "upgrade": (
        "Move each session whose epoch names an older App version onto the version a worker"
        " would load now: restart its worker, then compact, so its new epoch names that version."
    ),
    "verify": (
        "Check every session of the home, every epoch; a line each; exit 1 if any is refused."
    ),
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' section of ``loopd --help``, as click writes it, each line from
        ``SHORT_HELP`` where it has one (the command is not imported for it)."""
        commands: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            line = SHORT_HELP.get(name)
            command = self.get_command(ctx, name) if line is None else listed(name, line)
            if command is not None and not command.hidden:
                commands.append((name, command))
        if commands:
            limit = formatter.width - 6 - max(len(name) for name, _command in commands)
            rows = [(name, command.get_short_help_str(limit)) for name, command in commands]
            with formatter.section("Commands"):
                formatter.write_dl(rows)

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


def listed(name: str, line: str) -> click.Command:
    """A stand-in for command ``name`` whose short help is ``line``, shortened to a
    width as click shortens a command's help (it is never run)."""
    return click.Command(name, help=line)


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
