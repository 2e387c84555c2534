"""``loopd top``: the status of every session, redrawn in place with curses (q quits)."""

from __future__ import annotations

import contextlib
import curses
import os
import sys
import time
from typing import Final

import click

from supervisor.client.control import statuses
from supervisor.client.status_table import TopView
from supervisor.errors import ControlError
from worker.ipc.wire import Message

EXIT_ERROR: Final = 1
MIN_TIMEOUT: Final = 5.0
"""Seconds one refresh waits for the supervisor at least (longer when the interval is)."""
QUIT_KEYS: Final = frozenset({ord("q"), ord("Q"), 27})  # 27: Escape
HEADER_LINES: Final = 3  # the title, the summary, the table's header


def run_top(home: str, interval: float) -> int:
    """Show the live view until q; 1 with one line if this is not a terminal."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        click.echo("loopd top: needs a terminal (for a listing: loopd status)", err=True)
        return EXIT_ERROR
    # The terminal's own size, not $COLUMNS/$LINES (which curses would prefer): an
    # exported stale value would clip the view, and only the terminal follows a resize.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    try:
        curses.wrapper(_Screen(home, interval).run)
    except KeyboardInterrupt:
        pass
    except curses.error as exc:
        click.echo(f"loopd top: the terminal cannot be drawn on: {exc}", err=True)
        return EXIT_ERROR
    return 0


class _Screen:
    def __init__(self, home: str, interval: float) -> None:
        self.home = home
        self.interval = interval
        self.view = TopView()
        self.lines: list[str] = []
        self.offset = 0  # the first table row shown

    def run(self, screen: curses.window) -> None:
        with contextlib.suppress(curses.error):  # a terminal that cannot hide its cursor
            curses.curs_set(0)
        screen.keypad(True)
        while True:
            self.refresh()
            next_refresh = time.monotonic() + self.interval
            while (left := next_refresh - time.monotonic()) > 0:
                self.draw(screen)
                screen.timeout(max(1, int(left * 1000)))
                key = screen.getch()
                if key in QUIT_KEYS:
                    return
                self.scroll(key, screen.getmaxyx()[0] - HEADER_LINES)

    def refresh(self) -> None:
        """Fetch every row; a supervisor that does not answer is shown as such."""
        stamp = time.strftime("%H:%M:%S")
        try:
            rows: list[Message] = statuses(self.home, timeout=max(MIN_TIMEOUT, self.interval))
            problem = None
        except ControlError as exc:
            rows, problem = [], f"{exc.message} [{exc.code}]"
        title = f"loopd top  {self.home}  {stamp}  every {self.interval:g} s  (q quits)"
        if problem is not None:
            self.lines = [title, f"no answer: {problem}; retrying"]
        else:
            self.lines = [title, *self.view.lines(rows, time.monotonic())]

    def scroll(self, key: int, height: int) -> None:
        rows = max(0, len(self.lines) - HEADER_LINES)
        page = max(1, height)
        moves = {
            curses.KEY_DOWN: 1, curses.KEY_UP: -1, curses.KEY_NPAGE: page,
            curses.KEY_PPAGE: -page, curses.KEY_HOME: -rows, curses.KEY_END: rows,
        }  # fmt: skip
        if key in moves:
            self.offset = min(max(0, self.offset + moves[key]), max(0, rows - page))

    def draw(self, screen: curses.window) -> None:
        height, width = screen.getmaxyx()
        screen.erase()
        head, body = self.lines[:HEADER_LINES], self.lines[HEADER_LINES:]
        shown = head + body[self.offset : self.offset + max(0, height - len(head))]
        for y, line in enumerate(shown[:height]):
            with contextlib.suppress(curses.error):  # the last cell of a tiny window
                screen.addnstr(y, 0, line, max(0, width - 1), curses.A_BOLD if y < 2 else 0)
        screen.refresh()
