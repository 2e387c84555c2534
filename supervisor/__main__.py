"""``python -m supervisor``: the same CLI as the ``loopd`` console script."""

from __future__ import annotations

from supervisor.cli.group import main

main()
