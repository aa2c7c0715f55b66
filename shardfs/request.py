"""One request to the filesystem, as an object passed down to where it decodes and where it waits, never kept
in a thread: who asked (the kernel's unique id, uid, gid, pid), what it may still decode, and whether the
kernel interrupted it. As fuser passes a `Request` to every filesystem method and go-fuse a context with a
Cancel channel, the FUSE session makes one per request (fuse/session.py) and the filesystem takes it; below the
tree, codecs count decoded bytes against it and a store's wait on the network ends when it is interrupted.

Work that no caller asked for (read-ahead, a mount's planning, a command outside a mount such as `shardfs cat`)
is `OWN`: no budget, never interrupted by the kernel (a signal to the CLI's main thread still ends its wait)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shardfs.errors import OverLimit

_WAKE = threading.Lock()  # taken only by a wait and an interrupt of one request meeting: never on the hot path


class Request:
    """A FUSE request, or the daemon's own work (`OWN`). left: bytes it may still decode (None: no bound), of
    limit, as the filesystem sets them when it starts answering; interrupted: the kernel sent INTERRUPT for it
    (its caller was signalled, or is gone). Slotted and made with no event: a request costs its five fields
    until something waits on the network for it."""

    __slots__ = ("_wake", "gid", "interrupted", "left", "limit", "pid", "uid", "unique")

    def __init__(self, unique: int = 0, uid: int | None = None, gid: int | None = None, pid: int = 0) -> None:
        self.unique, self.uid, self.gid, self.pid = unique, uid, gid, pid
        self.left: int | None = None
        self.interrupted = False
        self._wake: Callable[[], None] | None = None

    def budget(self, limit: int) -> None:
        """From now on this request may decode limit bytes in all (4 files' worth: nested shards, a view), so
        that none, however its metadata and indexes are crafted, decodes without end."""
        self.left = self.limit = limit

    def spend(self, nbytes: int) -> None:
        """nbytes decoded for this request; OverLimit past its budget."""
        left = self.left
        if left is not None:
            self.left = left - nbytes
            if left < nbytes:
                raise OverLimit("this request has decoded more than its limit (4 times --max-file-size)", self.limit)

    def interrupt(self) -> None:
        """The kernel's INTERRUPT: whatever waits for this request is woken, and gives up."""
        with _WAKE:
            self.interrupted = True
            wake = self._wake
        if wake is not None:
            wake()

    def waking(self, wake: Callable[[], None] | None) -> bool:
        """Call wake on INTERRUPT from now on (None: no longer); False if interrupted already: the caller gives
        up now, as wake would have told it."""
        with _WAKE:
            self._wake = wake
            return not self.interrupted


OWN = Request()  # the daemon's own work, and a command's outside a mount: never budgeted, never interrupted
