"""How a worker of a scenario with a request deadline ended (the ``slow`` scenario).

``progress-spares-turn``: no worker of the scenario ends by SIGALRM. Its App's turns
are short, or a tool loop that calls ``worker.app.turn.progress()`` four times per deadline
(chaos/scenarios/slow_app.py), and a chunk of n requests has n deadlines: SIGALRM, the deadline's
signal, ends none of them unless progress did not restart the deadline or a chunk was
given less than its due. The rig's own faults end a worker by SIGKILL (or an exit code),
never by SIGALRM.
"""

from __future__ import annotations

import signal
from typing import Final

from chaos.oracle.oracle import ClientLog
from chaos.scenarios.scenarios import Scenario

PROGRESS: Final = "progress-spares-turn"


def judge_exit(log: ClientLog, scenario: Scenario, code: int) -> None:
    """Record a worker of a scenario with a deadline that the deadline ended."""
    if "--request-deadline" not in scenario.worker_args:
        return
    log.checks.add(PROGRESS)
    if code == -signal.SIGALRM:
        log.problem(
            PROGRESS,
            "a worker was ended by SIGALRM (its request deadline) though every turn of its "
            "App reported progress within the deadline",
        )
