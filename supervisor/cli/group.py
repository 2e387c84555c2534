"""The ``loopd`` operator CLI: one click group whose commands load only when used.

``loopd serve`` should not pay for the demo or the chaos rig, and forked workers
inherit whatever the supervisor has loaded, so each command is imported on demand.
Packages above supervisor (the chaos rig) add their command groups through the
``loopd.commands`` entry point, so that supervisor never imports them.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Final

import click

PLUGIN_GROUP: Final = "loopd.commands"
COMMANDS: Final = {
    "serve": "supervisor.cli.daemon_commands:serve",
    "create": "supervisor.cli.daemon_commands:create",
    "send": "supervisor.cli.daemon_commands:send",
    "compact": "supervisor.cli.daemon_commands:compact",
    "start": "supervisor.cli.daemon_commands:start",
    "stop": "supervisor.cli.daemon_commands:stop",
    "restart": "supervisor.cli.daemon_commands:restart",
    "status": "supervisor.cli.daemon_commands:status",
    "inspect": "supervisor.cli.offline_commands:inspect",
    "verify": "supervisor.cli.offline_commands:verify",
    "repair": "supervisor.cli.offline_commands:repair",
    "logs": "supervisor.cli.log_commands:logs",
    "tail": "supervisor.cli.tail_command:tail",
    "events": "supervisor.cli.stream_commands:events",
    "metrics": "supervisor.cli.stream_commands:metrics",
    "demo": "supervisor.cli.demo_command:demo",
    "move": "supervisor.cli.cluster_commands:move",
    "drain": "supervisor.cli.cluster_commands:drain",
    "takeover": "supervisor.cli.cluster_commands:takeover",
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        plugins = [entry.name for entry in entry_points(group=PLUGIN_GROUP)]
        return sorted({*COMMANDS, *plugins})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is not None:
            module, _, attribute = target.partition(":")
            command = getattr(importlib.import_module(module), attribute)
        else:
            found = [e for e in entry_points(group=PLUGIN_GROUP) if e.name == cmd_name]
            if not found:
                return None
            command = found[0].load()
        if not isinstance(command, click.Command):
            raise TypeError(f"{cmd_name} does not name a click command")
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loopd")
def main() -> None:
    """loopd: host many long-lived sessions without losing or corrupting their state."""
