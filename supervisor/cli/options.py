"""Click options shared by the operator commands."""

from __future__ import annotations

from typing import Final

import click

from supervisor.hosting.bounds import seconds

EXIT_ERROR: Final = 1
"""A command that could not do what it was asked (its one line on stderr says why)."""
HOME_ENV: Final = "LOOPD_HOME"

home_option = click.option(
    "--home",
    envvar=HOME_ENV,
    required=True,
    type=click.Path(file_okay=False),
    help=f"The loopd home directory (or ${HOME_ENV}).",
)

existing_home_option = click.option(
    "--home",
    envvar=HOME_ENV,
    required=True,
    # Checked by the command itself, so that a missing home, a file and a directory
    # without sessions/ each get one line saying which.
    type=click.Path(),
    help=f"An existing loopd home directory (or ${HOME_ENV}).",
)

TIMEOUT_ENV: Final = "LOOPD_TIMEOUT"

timeout_option = click.option(
    "--timeout",
    envvar=TIMEOUT_ENV,
    type=seconds(0.1),
    default=60.0,
    show_default=True,
    help=f"Seconds to wait for the supervisor's answer (or ${TIMEOUT_ENV}).",
)

CLUSTER_ENV: Final = "LOOPD_CLUSTER"


class EtcdUrl(click.types.StringParamType):
    """``http(s)://host:port`` of etcd members, comma-separated, checked before anything
    connects to them."""

    name = "url"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        # only when --cluster is given: urllib.parse and the endpoint table (issue 32)
        from supervisor.cluster.etcd_endpoints import parse_endpoints  # noqa: PLC0415 - --cluster

        text = str(value)
        try:
            parse_endpoints(text)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return text


ETCD_URL: Final = EtcdUrl()

client_home_option = click.option(
    "--home",
    envvar=HOME_ENV,
    default=None,
    type=click.Path(file_okay=False),
    help=f"The loopd home directory (or ${HOME_ENV}); not with --cluster.",
)

EXIT_USAGE: Final = 2
REPLICAS_RETIRED: Final = (
    "--replicas is retired: loopd no longer copies logs between hosts; put sessions in "
    "PostgreSQL with --store postgresql://... (docs/scaling.md)"
)


def _refuse_replicas(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """Any ``--replicas``: one line saying what replaced it, exit 2 (before anything runs)."""
    if value is not None:
        click.echo(f"loopd {ctx.info_name}: {REPLICAS_RETIRED}", err=True)
        ctx.exit(EXIT_USAGE)


retired_replicas_option = click.option(
    "--replicas",
    hidden=True,
    is_eager=True,
    expose_value=False,
    default=None,
    callback=_refuse_replicas,
    help="retired: loopd no longer copies logs between hosts (docs/scaling.md).",
)


cluster_option = click.option(
    "--cluster",
    envvar=CLUSTER_ENV,
    default=None,
    type=ETCD_URL,
    help=f"etcd URL http(s)://host:port[,...] (or ${CLUSTER_ENV}): find the session's node there.",
)
