"""What the FUSE session asks of a filesystem: requests by node id, answers as typed values.

The session (session.py) speaks the kernel's protocol: it reads requests, settles what the kernel is granted,
packs answers and decides what waits in which thread. What a node is, what it holds and which id names it is
the filesystem's (fs/bridge.py, over the virtual tree): the session knows no path and no format. A node id is
the kernel's from the LOOKUP that answered it until FORGET counts down that LOOKUP; the root's is always
`wire.ROOT_ID`, never looked up and never forgotten.
"""

from __future__ import annotations

import errno
from typing import NamedTuple, Protocol

from shardfs.fuse.listing import Listing
from shardfs.metrics import Metrics
from shardfs.request import Request

BLOCK_SIZE = 1 << 20  # st_blksize: tools such as cp size their reads by it
NAME_MAX = 255  # the longest name a Linux filesystem holds (STATFS says so); the kernel passes FUSE up to 1,024


class FuseError(Exception):
    """A request answered with this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(errno.errorcode.get(code, str(code)))
        self.errno = code


class StaleNode(Exception):
    """A node id the filesystem does not hold (never issued, or forgotten): ESTALE, and a bug logged."""


class Attributes(NamedTuple):
    """A node's fuse_attr after its id, field for field as the kernel reads them (`wire.ATTR`)."""

    size: int
    blocks: int  # of 512 bytes
    atime: int
    mtime: int
    ctime: int
    atimensec: int
    mtimensec: int
    ctimensec: int
    mode: int
    nlink: int
    uid: int
    gid: int
    rdev: int
    blksize: int
    flags: int


Entry = tuple[int, Attributes]  # a name looked up: the id the kernel holds it by from now on, and its attributes


class Usage(NamedTuple):
    """What STATFS shows: the bytes and files the source stores."""

    nbytes: int
    files: int


class Filesystem(Protocol):
    """A read-only filesystem served by node id. Every method raises FuseError for an answer that is an
    errno (counted and logged where it is raised) and StaleNode for an id it does not hold. Those that may wait
    or decode take the request they answer (as fuser's take its `Request`): who asks, what it may still decode,
    and whether the kernel interrupted it (one that waits on the network is answered EINTR by the session)."""

    def lookup(self, request: Request, parent: int, name: bytes) -> Entry | None:
        """The entry named name in directory parent, its id counted one lookup more; None if there is none
        (an absence the kernel may keep)."""

    def forget(self, node: int, lookups: int) -> None:
        """The kernel let go of node that many lookups; an id it never held is no error (after a restart)."""

    def getattr(self, request: Request, node: int) -> Attributes: ...

    def open(self, request: Request, node: int) -> None:
        """Whether node may be opened for reading: a handle holds nothing (handle 0)."""

    def read(self, request: Request, node: int, offset: int, size: int) -> bytes:
        """Up to size bytes of file node from offset (fewer only at its end)."""

    def opendir(self, request: Request, node: int) -> None:
        """Whether node may be opened as a directory: a handle holds nothing, its offsets name entries."""

    def listed(self, node: int) -> Listing | None:
        """Directory node's listing if it is made already (answering from it waits on nothing), else None."""

    def listing(self, request: Request, node: int) -> Listing:
        """Directory node's listing, made now if need be: it may wait on the source."""

    def statfs(self) -> Usage: ...


def count(metrics: Metrics, code: int) -> None:
    """Count an error answer in a mount's metrics (ENOENT is an answer, not an error)."""
    if code != errno.ENOENT:
        metrics.errors.labels(errno.errorcode.get(code, str(code))).inc()


def error(metrics: Metrics, code: int) -> FuseError:
    """FuseError of code, counted in metrics."""
    count(metrics, code)
    return FuseError(code)
