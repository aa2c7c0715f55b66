"""One request to the filesystem, as an object passed down to where it decodes and where it waits, never kept
in a thread: who asked (the kernel's unique id, uid, gid, pid), what it may still decode, and whether the
kernel interrupted it. As fuser passes a `Request` to every filesystem method and go-fuse a context with a
Cancel channel, the FUSE session makes one per request (fuse/session.py) and the filesystem takes it; below the
tree, codecs count decoded bytes against it and a store says when it waits on the network, so that an
INTERRUPT then is answered at once.

Work that no caller asked for (read-ahead, a mount's planning, a command outside a mount such as `shardfs cat`)
is `OWN`: no budget, never interrupted by the kernel (a signal to the CLI's main thread still ends its wait)."""

from __future__ import annotations

import threading

from shardfs.errors import OverLimit

_WAITING = threading.Lock()  # orders a request's wait on the network and its INTERRUPT: held for two field writes


class Request:
    """A FUSE request, or the daemon's own work (`OWN`). left: bytes it may still decode (None: no bound), of
    limit, as the filesystem sets them when it starts answering; interrupted: the kernel sent INTERRUPT for it
    (its caller was signalled, or is gone). Slotted: a request costs its fields, and nothing else."""

    __slots__ = ("gid", "interrupted", "left", "limit", "pid", "uid", "unique", "waiting")

    def __init__(self, unique: int = 0, uid: int | None = None, gid: int | None = None, pid: int = 0) -> None:
        self.unique, self.uid, self.gid, self.pid = unique, uid, gid, pid
        self.left: int | None = None
        self.interrupted = False
        self.waiting = False  # on the network, in its own thread (`waits`)

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

    def interrupt(self) -> bool:
        """The kernel's INTERRUPT. True (once) if the request waits on the network now: whoever interrupts it
        then answers it (EINTR), since its thread answers only once the server has, and drops that answer."""
        with _WAITING:
            first, self.interrupted = not self.interrupted, True
            return first and self.waiting

    def waits(self) -> bool:
        """Its thread starts to wait on the network; False if interrupted already: it gives up instead."""
        with _WAITING:
            self.waiting = not self.interrupted
            return self.waiting

    def waited(self) -> bool:
        """Its wait has ended; False if it was interrupted meanwhile: its caller has been answered EINTR."""
        with _WAITING:
            self.waiting = False
            return not self.interrupted


OWN = Request()  # the daemon's own work, and a command's outside a mount: never budgeted, never interrupted
