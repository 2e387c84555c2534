"""``python -m chaos.run.mutant_serve MUTANT serve ...``: ``loopd serve`` with one of
``chaos.mutants.SERVE_MUTANTS`` patched in before it starts (the templates and workers it
forks inherit it; a worker it starts with exec would not). The CLI is run as
``python -m supervisor`` runs it (no module of the rig imports the CLI)."""

from __future__ import annotations

import runpy
import sys

from chaos import mutants

if __name__ == "__main__":
    mutants.apply(sys.argv.pop(1))
    runpy.run_module("supervisor", run_name="__main__", alter_sys=True)
