"""Click types for bounded settings: a float must be finite and a number must be in range.

``click.FloatRange(min=0.1)`` takes ``nan`` (every comparison with it is false) and
``inf``; a ``nan`` hang timeout kills every worker at its first heartbeat check, an
``inf`` one crashes them when it reaches a timer. Every float option of loopd is a
``FiniteRange``, with an upper bound as well, so a flag, an environment variable and a
key of ``loopd.toml`` (which runs the option's own type) are refused in one line.
"""

from __future__ import annotations

import math
from typing import Final

import click

DAY: Final = 86_400.0
MAX_SECONDS: Final = 7 * DAY
"""The longest interval any setting takes: a week (longer is a typo, not a choice)."""


class FiniteRange(click.FloatRange):
    """A float in ``[low, high]`` (both required) that is neither nan nor infinite."""

    name = "finite float range"

    def __init__(self, low: float, high: float) -> None:
        super().__init__(min=low, max=high)

    def convert(
        self, value: str | float, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (ValueError, OverflowError):
            self.fail(f"{value!r} is not a valid number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def seconds(low: float, high: float = MAX_SECONDS) -> FiniteRange:
    """A duration option's type: finite, at least ``low`` and at most ``high`` seconds."""
    return FiniteRange(low, high)
