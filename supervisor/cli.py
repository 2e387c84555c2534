"""The ``loopd`` operator CLI: one click group; each concern registers its commands."""

from __future__ import annotations

from importlib.metadata import entry_points

import click

from supervisor import daemon_commands, offline_commands
from supervisor.demo import demo

PLUGIN_GROUP = "loopd.commands"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loopd")
def main() -> None:
    """loopd: host many long-lived sessions without losing or corrupting their state."""


for command in (*daemon_commands.COMMANDS, *offline_commands.COMMANDS, demo):
    main.add_command(command)

# Packages above supervisor (the chaos rig) add their command groups through an entry
# point, so that supervisor never imports them.
for entry in entry_points(group=PLUGIN_GROUP):
    main.add_command(entry.load(), name=entry.name)
