"""The node ids the kernel holds, and what each names: a numbered file's key, or a path in a table.

A file a provider numbers (a chunk) has for id its name: PACKED, then its directory's number, then its key.
Nothing is kept for it, FORGET of it has nothing to do, a request for it goes from its id straight to its
key, and the same file has the same id (and so `st_ino`) on every mount of the same metadata: memory grows
with directories, not with the files the kernel has seen. Every other path (directories, metadata, files
passed through, a key too large to pack) gets an id from a table, with the kernel's lookup count of it, and
is dropped at zero; the table holds each path located (`tree.Located`: its provider found once), so a LOOKUP
in a directory goes from its node and the name to the child with no walk up the path. Table ids are never
reused, so a stale id from the kernel is an error, not another file. With a record (record.py), the table is
journalled there and restored from it at start: the kernel may hold table ids across a restart of the daemon.
So are the numbers a directory of datasets gives its datasets' directories as they are browsed (collection.py),
each before an id names it: the next daemon's packed ids name the same files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from shardfs.fuse import wire
from shardfs.fuse.filesystem import StaleNode
from shardfs.fuse.record import Record
from shardfs.tree import Located, Place

PACKED = 1 << 63  # set in the node id of a numbered file; never in a table's
# A table id restored from a record: the kernel's count of its lookups is the daemon before's, unknown here,
# so it is never counted down to nothing (the table keeps it; directories are few).
UNKNOWN_COUNT = 1 << 62


class Keys(Protocol):
    """Paths located, and those that are numbers: a provider's directory numbered, a key below it (`Tree`)."""

    @property
    def numbers(self) -> int:
        """How many directories may be numbered: the bits of a packed id its directory's number takes."""
        ...

    def numbering(self, numbered: list[str], journal: Callable[[str], None]) -> None:
        """The directories a daemon before numbered (a record's), and where a directory numbered now is said."""
        ...

    def locate(self, path: str) -> Located: ...

    def child(self, parent: Located, name: str) -> Place: ...

    def path_of(self, number: int, key: int) -> str | None: ...


class Nodes:
    """Node ids of what the kernel holds (see the module's docstring)."""

    def __init__(self, keys: Keys, record: Record | None = None) -> None:
        self._keys = keys
        self._record = record
        self._places: dict[int, Located] = {wire.ROOT_ID: keys.locate("")}
        self._ids: dict[str, int] = {"": wire.ROOT_ID}
        self._counts: dict[int, int] = {}
        self._next = wire.ROOT_ID + 1
        self._lock = threading.Lock()
        if record is not None:
            for nodeid, path in record.table().items():
                self._places[nodeid], self._ids[path], self._counts[nodeid] = keys.locate(path), nodeid, UNKNOWN_COUNT
            self._next = max(self._next, record.highest + 1)
            keys.numbering(record.numbered, self._numbered)
        self._shift = 63 - max(keys.numbers - 1, 0).bit_length()  # bits of the key, below the number's
        self._mask = (1 << self._shift) - 1

    def __len__(self) -> int:
        """Paths in the table."""
        return len(self._places)

    def place(self, nodeid: int) -> Place:
        """What nodeid names: (number, key) of a numbered file, else a path located; StaleNode if no such id is
        held."""
        if nodeid & PACKED:
            return (nodeid ^ PACKED) >> self._shift, nodeid & self._mask
        try:
            return self._places[nodeid]
        except KeyError:
            raise StaleNode(nodeid) from None

    def located(self, nodeid: int) -> Located:
        """The path of a node the kernel holds, located (a directory's, for every LOOKUP in it: one call, one
        probe); StaleNode if it holds no such node."""
        place = self.place(nodeid)
        if isinstance(place, Located):
            return place
        path = self._keys.path_of(*place)  # a numbered file, asked as a directory: it answers as its path would
        if path is None:
            raise StaleNode(nodeid)
        return self._keys.locate(path)

    def _named(self, place: Place) -> int | Located:
        """The node id that is a numbered file's name; else place located (a key too large to pack, by path)."""
        if isinstance(place, Located):
            return place
        number, key = place
        if not key >> self._shift:
            return PACKED | number << self._shift | key
        path = self._keys.path_of(number, key)
        assert path is not None, place  # `child` gave place for a path
        return Located(path, number)

    def ino(self, directory: Located, name: str) -> int:
        """The inode number a listing of directory shows for name (`find -inum` and `-printf %i` take it): its
        node id where that needs no lookup counted (a numbered file, or one the table holds), else unknown."""
        named = self._named(self._keys.child(directory, name))
        return named if isinstance(named, int) else self._ids.get(named.path, wire.UNKNOWN_INO)

    def looked_up(self, place: Place) -> int:
        """The id of place, counted once more if it is in the table."""
        named = self._named(place)
        if isinstance(named, int):
            return named
        with self._lock:
            nodeid = self._ids.get(named.path)
            if nodeid is None:
                nodeid = self._next
                self._next += 1
                self._ids[named.path] = nodeid
                self._places[nodeid] = named
                if self._record is not None:
                    self._record.added(nodeid, named.path)
            if nodeid != wire.ROOT_ID:
                self._counts[nodeid] = self._counts.get(nodeid, 0) + 1
            return nodeid

    def _numbered(self, directory: str) -> None:
        """directory has the next number: journalled (under the table's lock: one writer of the record)."""
        assert self._record is not None
        with self._lock:
            self._record.number(directory)

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
                path = self._places.pop(nodeid).path
                del self._ids[path]
                if self._record is not None:
                    self._record.dropped(nodeid, path, self._ids)
