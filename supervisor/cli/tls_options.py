"""The TLS options of ``serve`` and of every client command (docs/scaling.md, "The transport")."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

import click

if TYPE_CHECKING:
    from supervisor.client.cluster import ClusterClient
    from supervisor.cluster.transport import TlsFiles

# The transport (and ssl, 17 ms) is imported when a TLS option or --cluster is given,
# not by every command that offers them (issue 32).

F = TypeVar("F", bound=Callable[..., object])
EXIT_USAGE: Final = 2
ENV: Final = {"ca": "LOOPD_TLS_CA", "cert": "LOOPD_TLS_CERT", "key": "LOOPD_TLS_KEY"}
"""supervisor.cluster.transport's ENV, spelled here so that no option loads ssl (a
test checks they are the same)."""
_META: Final = "loopd.tls"
TLS_PARAMS: Final = ("tls_ca", "tls_cert", "tls_key")


class TlsAddress(click.ParamType):  # type: ignore[type-arg]
    """``tls://HOST:PORT``: a node's TLS port."""

    name = "tls://HOST:PORT"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        from supervisor.cluster.transport import TransportError, parse_tls_address  # noqa: PLC0415 - ssl

        text = str(value)
        try:
            parse_tls_address(text)
        except TransportError as exc:
            self.fail(str(exc), param, ctx)
        return text


TLS_ADDRESS: Final = TlsAddress()
_FLAGS: Final = (
    ("--tls-key", ENV["key"], "its private key (PEM)"),
    ("--tls-cert", ENV["cert"], "this peer's certificate (PEM)"),
    ("--tls-ca", ENV["ca"], "the cluster CA's certificate (PEM)"),
)


def tls_files(ca: object, cert: object, key: object) -> TlsFiles | None:
    """The three files, or None; a one-line error and exit 2 if only some are given."""
    if ca is None and cert is None and key is None:
        return None
    from supervisor.cluster.transport import TlsFiles, TransportError  # noqa: PLC0415 - ssl

    try:
        return TlsFiles.from_options(
            None if ca is None else str(ca),
            None if cert is None else str(cert),
            None if key is None else str(key),
        )
    except TransportError as exc:
        click.echo(f"loopd: {exc}", err=True)
        sys.exit(EXIT_USAGE)


def serve_tls_options(command: F) -> F:
    """``serve``'s --tls-ca, --tls-cert, --tls-key (also keys of loopd.toml) and --listen."""
    for flag, env, what in _FLAGS:
        command = click.option(flag, envvar=env, default=None, type=click.Path(dir_okay=False),
                               help=f"mutual TLS: {what} (or ${env}).")(command)  # fmt: skip
    return click.option(
        "--listen", default=None, type=TLS_ADDRESS,
        help="tls://HOST:PORT: the node's TLS port, registered in etcd (needs --tls-*).",
    )(command)  # fmt: skip


def _remember(ctx: click.Context, param: click.Parameter, value: object) -> None:
    if param.name is not None:
        ctx.meta.setdefault(_META, {})[param.name] = value


def client_tls_options(command: F) -> F:
    """A client command's --tls-ca, --tls-cert, --tls-key, read by ``cluster_client``."""
    for flag, env, what in _FLAGS:
        command = click.option(flag, envvar=env, default=None, type=click.Path(dir_okay=False),
                               expose_value=False, callback=_remember,
                               help=f"mutual TLS: {what} (or ${env}).")(command)  # fmt: skip
    return command


def tls_files_given() -> TlsFiles | None:
    """The TLS files of the command being run (``client_tls_options``), or None."""
    given = click.get_current_context().meta.get(_META, {})
    return tls_files(given.get("tls_ca"), given.get("tls_cert"), given.get("tls_key"))


def cluster_tls_files(url: str) -> TlsFiles | None:
    """The command's TLS files for etcd at ``url``; one line and exit 2 if it is https://
    and none is given (the client cannot even be made: it would be a traceback)."""
    from supervisor.cluster.etcd_endpoints import parse_endpoints  # noqa: PLC0415 - --cluster

    files = tls_files_given()
    if files is None and any(e.scheme == "https" for e in parse_endpoints(url)):
        flags = ", ".join(f"{flag} (${env})" for flag, env, _what in reversed(_FLAGS))
        click.echo(f"loopd: --cluster {url[:200]} is https: a client certificate is needed: "
                   f"{flags} not given", err=True)  # fmt: skip
        sys.exit(EXIT_USAGE)
    return files


def cluster_client(url: str, *, timeout: float) -> ClusterClient:
    """A ClusterClient of ``url`` with the command's TLS files (for tls:// nodes)."""
    from supervisor.client.cluster import ClusterClient  # noqa: PLC0415 - a --cluster call only

    return ClusterClient(url, timeout=timeout, tls=cluster_tls_files(url))
