"""The node ids the kernel holds, and what each names: a numbered file's key, or a path in a table.

A file a provider numbers (a chunk) has for id its name: PACKED, then its directory's number, then its key.
Nothing is kept for it, FORGET of it has nothing to do, a request for it goes from its id straight to its
key, and the same file has the same id (and so `st_ino`) on every mount of the same metadata: memory grows
with directories, not with the files the kernel has seen. Every other path (directories, metadata, files
passed through, a key too large to pack) gets an id from a table, with the kernel's lookup count of it, and
is dropped at zero. Table ids are never reused, so a stale id from the kernel is an error, not another file.
With a record (record.py), the table is journalled there and restored from it at start: the kernel may hold
table ids across a restart of the daemon.
"""

from __future__ import annotations

import threading
from typing import Protocol

from shardfs.fuse import wire
from shardfs.fuse.filesystem import StaleNode
from shardfs.fuse.record import Record

PACKED = 1 << 63  # set in the node id of a numbered file; never in a table's
# A table id restored from a record: the kernel's count of its lookups is the daemon before's, unknown here,
# so it is never counted down to nothing (the table keeps it; directories are few).
UNKNOWN_COUNT = 1 << 62

Numbered = tuple[int, int]  # (number of a provider's directory, key of a file below it): `Tree.key_of`
Place = str | Numbered  # what a node id names: a path, or a numbered file


class Keys(Protocol):
    """Paths that are numbers: a provider's directory numbered, and a key below it (`Tree.key_of`)."""

    numbered: list[str]  # the provider directories, by number

    def key_of(self, path: str) -> Numbered | None: ...

    def path_of(self, number: int, key: int) -> str | None: ...


class Nodes:
    """Node ids of what the kernel holds (see the module's docstring)."""

    def __init__(self, keys: Keys, record: Record | None = None) -> None:
        self._keys = keys
        self._record = record
        self._shift = 63 - max(len(keys.numbered) - 1, 0).bit_length()  # bits of the key, below the number's
        self._mask = (1 << self._shift) - 1
        self._paths: dict[int, str] = {wire.ROOT_ID: ""}
        self._ids: dict[str, int] = {"": wire.ROOT_ID}
        self._counts: dict[int, int] = {}
        self._next = wire.ROOT_ID + 1
        self._lock = threading.Lock()
        if record is not None:
            for nodeid, path in record.table().items():
                self._paths[nodeid], self._ids[path], self._counts[nodeid] = path, nodeid, UNKNOWN_COUNT
            self._next = max(self._next, record.highest + 1)

    def __len__(self) -> int:
        """Paths in the table."""
        return len(self._paths)

    def place(self, nodeid: int) -> Place:
        """What nodeid names: (number, key) of a numbered file, else a path; StaleNode if no such id is held."""
        if nodeid & PACKED:
            return (nodeid ^ PACKED) >> self._shift, nodeid & self._mask
        return self.path(nodeid)

    def path(self, nodeid: int) -> str:
        """The path of a node the kernel holds (a directory's, for every LOOKUP in it: one call, one probe);
        StaleNode if it holds no such node."""
        if nodeid & PACKED:
            path = self._keys.path_of(*self.place(nodeid))  # type: ignore[misc]
            if path is None:
                raise StaleNode(nodeid)
            return path
        try:
            return self._paths[nodeid]
        except KeyError:
            raise StaleNode(nodeid) from None

    def _packed(self, found: Numbered | None) -> int | None:
        """The node id that is a numbered file's name, or None if found is None or its key does not fit."""
        return None if found is None or found[1] >> self._shift else PACKED | found[0] << self._shift | found[1]

    def ino(self, path: str) -> int:
        """The inode number a listing shows for path (`find -inum` and `-printf %i` take it): its node id
        where that needs no lookup counted (a numbered path, or one the table holds), else unknown."""
        packed = self._packed(self._keys.key_of(path))
        return self._ids.get(path, wire.UNKNOWN_INO) if packed is None else packed

    def looked_up(self, path: str, found: Numbered | None) -> int:
        """The id of path (numbered found, `Tree.key_of`), counted once more if it is in the table."""
        nodeid = self._packed(found)
        if nodeid is not None:
            return nodeid
        with self._lock:
            nodeid = self._ids.get(path)
            if nodeid is None:
                nodeid = self._next
                self._next += 1
                self._ids[path] = nodeid
                self._paths[nodeid] = path
                if self._record is not None:
                    self._record.added(nodeid, path)
            if nodeid != wire.ROOT_ID:
                self._counts[nodeid] = self._counts.get(nodeid, 0) + 1
            return nodeid

    def forget(self, nodeid: int, times: int) -> None:
        """The kernel let go of nodeid times lookups; at none left a table id is dropped."""
        if nodeid & PACKED:
            return
        with self._lock:
            left = self._counts.get(nodeid, 0) - times
            if left > 0:
                self._counts[nodeid] = left
            elif nodeid in self._counts:
                del self._counts[nodeid]
                path = self._paths.pop(nodeid)
                del self._ids[path]
                if self._record is not None:
                    self._record.dropped(nodeid, path, self._paths)
