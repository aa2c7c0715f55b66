"""The seam between where bytes live and everything above: the `Store` protocol, the byte ranges it is asked
for, and the values it answers with. Every read is a byte range of one version of one file, so a chunk never
costs a whole shard and an index is never applied to bytes it was not read from.

A range is asked for in one typed way (`Range`: offset and length; `Suffix`: the last n bytes, where the size
is not known yet), as HTTP's Range header, obstore and zarr-python's ByteRequest have it; what a store can do
(list, read in pieces, keep reads in flight) are properties, so callers ask instead of knowing its class.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from shardfs.request import OWN, Request

# The bits a class of users needs on a directory to pass it: search for owner, group, others.
_SEARCH = (0o100, 0o010, 0o001)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may read a node: uid, gid and the read/search bits it is shown with (never write)."""

    uid: int
    gid: int
    mode: int

    @classmethod
    def of(cls, st: os.stat_result) -> Owner:
        bits = 0o555 if stat.S_ISDIR(st.st_mode) else 0o444
        return cls(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & bits)

    def beneath(self, directories: tuple[Owner, ...]) -> Owner:
        """This node as reached through directories: a class of users keeps its bits only if every one of
        them surely lets that class search it. Unknown group memberships count against, so this never
        grants more than the source does, and for the usual modes (0755, 0750, 0700) it grants the same."""
        mode = self.mode
        for d in directories:
            ux, gx, ox = (bool(d.mode & bit) for bit in _SEARCH)
            if not (ux and gx and ox):
                mode &= ~0o007  # anyone may be its owner, in its group or neither
            if not (ux and gx and (ox or d.gid == self.gid)):
                mode &= ~0o070  # a member of our group may be its owner, or outside its group
            if not ((d.uid == self.uid and ux) or (gx and ox)):
                mode &= ~0o700
        return Owner(self.uid, self.gid, mode)

    def also(self, other: Owner) -> Owner:
        """This file's owner, narrowed to those who surely may read other too: bytes made of two files are
        readable only by whoever may read both. Reading other is what searching a directory of its read
        bits would be, so `beneath` decides it, unknown group memberships counting against as there."""
        return self.beneath((Owner(other.uid, other.gid, (other.mode & 0o444) >> 2),))


class StoreChanged(OSError):
    """A file changed under the mount: what an index says of it no longer holds. The read is EIO."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EIO, f"changed under the mount ({why})", path)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One version of one file of the source. An index read from it is cached under its version, and
    data read through that index comes from the same version, or the read fails."""

    path: str
    size: int
    version: tuple
    owner: Owner
    store: Store = field(compare=False, repr=False)

    def read(self, start: int, stop: int, request: Request = OWN) -> bytes:
        """Exactly bytes [start, stop) of this version; StoreChanged if they cannot be had. request: whose read
        it is (interrupted while it waits on the network: InterruptedError once the wait ends)."""
        return self.store.read(self, start, stop, request) if stop > start else b""

    def next_data(self, offset: int) -> int:
        """The first offset at or after offset that may hold data (sparse files skip their holes)."""
        return self.store.next_data(self, offset)

    def pieces(self, start: int, stop: int, request: Request = OWN) -> Iterator[bytes]:
        """Bytes [start, stop) of this version, read a piece at a time as they are consumed."""
        step = self.store.piece_size
        return (self.read(at, min(at + step, stop), request) for at in range(start, stop, step))


@dataclass(frozen=True, slots=True)
class JoinedFile(StoredFile):
    """Two stored files read as their concatenation: offsets below head's size are head's, the others tail's
    at offset - head's size. (The earlier precomputed layout stores a shard as its index and the rest.) Its
    version is both files', and every read checks each file's own, so neither half is read at another one."""

    head: StoredFile
    tail: StoredFile

    @classmethod
    def of(cls, path: str, head: StoredFile, tail: StoredFile) -> JoinedFile:
        """path: what the two are called together, in messages and cache keys."""
        version = (head.version, tail.version)
        return cls(path, head.size + tail.size, version, tail.owner.also(head.owner), tail.store, head, tail)

    def read(self, start: int, stop: int, request: Request = OWN) -> bytes:
        cut = self.head.size  # each part is b"" where the range misses it, and b"" + part is part, uncopied
        head = self.head.read(start, min(stop, cut), request)
        return head + self.tail.read(max(start, cut) - cut, stop - cut, request)

    def next_data(self, offset: int) -> int:
        cut = self.head.size
        if offset < cut and (found := self.head.next_data(offset)) < cut:
            return found
        return cut + self.tail.next_data(max(offset, cut) - cut)


@dataclass(frozen=True, slots=True)
class Range:
    """Bytes [offset, offset + length) of a file: fewer where it ends sooner."""

    offset: int
    length: int

    def within(self, size: int) -> tuple[int, int]:
        """(start, stop) of the range in a file of size bytes."""
        return min(self.offset, size), min(self.offset + self.length, size)


@dataclass(frozen=True, slots=True)
class Suffix:
    """The last length bytes of a file (all of it where it is shorter): a zarr shard's index at its end, asked
    for before the shard's size is known."""

    length: int

    def within(self, size: int) -> tuple[int, int]:
        return max(size - self.length, 0), size


ByteRange = Range | Suffix


class Store(Protocol):
    """What formats, views and the tree know of where bytes live."""

    @property
    def can_list(self) -> bool:
        """False where directories cannot be listed (HTTP): they list as empty."""

    @property
    def piece_size(self) -> int:
        """Bytes read at a time when a value is decoded as it is read."""

    @property
    def reads_at_once(self) -> int:
        """Reads a listing keeps in flight: 1 where a read waits on nothing but itself."""

    def reads(self) -> Executor | None:
        """The threads every listing's reads run in (one set per store, sized once), or None where a read
        is run by the thread that wants it."""

    def open(self, path: str) -> StoredFile:
        """The current version of a regular file; FileNotFoundError if there is none."""

    def open_reading(self, path: str, want: ByteRange, request: Request = OWN) -> tuple[StoredFile, bytes]:
        """open() and the bytes of that version that want asks for, at the cost of the read alone where the
        store can: a remote one learns the version from the read's answer."""

    def read(self, file: StoredFile, start: int, stop: int, request: Request = OWN) -> bytes:
        """Bytes [start, stop) of file's version, for request: a store that waits on a network says so
        (`Request.waits`), so that an INTERRUPT meanwhile is answered at once, and drops the answer
        (InterruptedError); one that waits on nothing else (a disk) reads on."""

    def next_data(self, file: StoredFile, offset: int) -> int: ...

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of a directory's files and directories, streamed; nothing if it is absent."""

    def type_of(self, path: str) -> str | None:
        """'file', 'dir', or None for anything else (absent, a link, a device)."""

    def is_file(self, path: str) -> bool:
        """Whether type_of would say 'file', asking no more than that: a bucket is not also asked whether path
        is a prefix (a metadata file's probe costs one request, not two)."""

    def owner(self, path: str) -> Owner:
        """Who may read the node that stands for path: a file or directory as the source has it, an
        absent one as its nearest directory. Narrowed by every directory on the way."""

    def where(self, path: str) -> str:
        """path as a user would name it, for messages."""

    def forget(self) -> None:
        """Close what is open and forget what was learned, so that the source is read afresh."""

    def descriptors(self) -> list[int]:
        """File descriptors the store needs kept open across a daemon's detaching."""

    def sizes(self) -> Iterator[int]:
        """The size of every file the source stores, streamed (for `df`); nothing where it cannot be listed."""
