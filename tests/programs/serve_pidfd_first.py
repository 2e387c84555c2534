"""``loopd serve`` whose selector hands out pidfd events before every other event of a turn.

When a worker dies, its pidfd and the end of its channel can become readable in the same
turn of the loop, in either order: the kernel chooses. Run as ``python -m
tests.programs.serve_pidfd_first serve ...``, this makes the order fixed (deaths first), so a test
can reproduce the turn in which a death is handled before its channel's last event.
"""

from __future__ import annotations

import os
import selectors

from supervisor.cli.group import main


class PidfdFirstSelector(selectors.EpollSelector):
    """An epoll selector that puts the ready pidfds at the head of each batch."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return sorted(super().select(timeout), key=lambda event: not _is_pidfd(event[0].fd))


def _is_pidfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
    except OSError:
        return False


if __name__ == "__main__":
    selectors.DefaultSelector = PidfdFirstSelector  # type: ignore[misc,assignment]
    main()
