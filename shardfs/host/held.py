"""The connections a host holds for their next daemon, by target, in its own memory: each mount's /dev/fuse
descriptor (the one the host mounted) and, once its daemon sent it, the connection's record (fuse/record.py).
What the keeper (service/keeper.py) does over a socket for daemons elsewhere, called here directly."""

from __future__ import annotations

import contextlib
import os
import select
import threading


class Held:
    """Descriptors by target. What goes in is copied (the caller still closes its own); what comes out is a copy
    the caller closes."""

    def __init__(self) -> None:
        self._held: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def keep(self, target: str, fds: list[int]) -> None:
        """Hold copies of fds under target, in place of what was held there."""
        copies = [os.dup(fd) for fd in fds]
        with self._lock:
            _close(self._held.pop(target, []))
            self._held[target] = copies

    def take(self, target: str) -> list[int]:
        """Copies of what target holds ([] if nothing, or if its connection has ended: it is dropped then, as the
        keeper drops a connection the kernel reports ended)."""
        with self._lock:
            held = self._held.get(target, [])
            if held and _ended(held[0]):
                _close(self._held.pop(target))
                return []
            return [os.dup(fd) for fd in held]

    def drop(self, target: str) -> None:
        """The mount is ending: what target holds is closed."""
        with self._lock:
            _close(self._held.pop(target, []))


def _ended(fd: int) -> bool:
    """Whether a /dev/fuse descriptor's connection has ended (unmounted, aborted): the kernel says POLLERR."""
    poller = select.poll()
    poller.register(fd, 0)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
