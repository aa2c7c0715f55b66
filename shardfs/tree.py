"""The virtual filesystem as plain objects: what exists at a path, what a directory lists, what a file reads.

A mount is the source directory passed through, with an overlay of rewritten files (metadata with
sharding removed) and of *providers*: directories whose children are computed from shard indexes.
The FUSE adapter, `shardfs ls`/`cat` and the tests all use this, so FUSE knows nothing of formats.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from shardfs.cache import ByteCache
from shardfs.store import LocalStore


class File(Protocol):
    owner: Owner | None

    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may read a node, as the source says: its uid, gid and read/search bits (never write)."""

    uid: int
    gid: int
    mode: int

    @classmethod
    def of(cls, st: os.stat_result) -> Owner:
        return cls(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o555)


class Dir:
    """A directory node; what it lists comes from `Tree.listdir`. Virtual ones have no owner of their own."""

    owner: Owner | None = None


class SourceDir(Dir):
    def __init__(self, owner: Owner) -> None:
        self.owner = owner


DIR = Dir()
Node = File | Dir


class Provider(Protocol):
    """A directory whose contents are computed, such as one file per key of a sharded directory.
    Paths given to it are relative to its own directory ('' is the directory itself)."""

    kind: str  # what it is, in the user's words, for `shardfs info`

    def describe(self) -> dict[str, Any]:
        """Its parameters, for `shardfs info`."""

    def child(self, rel: str) -> Node | None:
        """The node at rel; None if rel is not the provider's (then the source decides).
        Raises FileNotFoundError for a path it owns that does not exist."""

    def entries(self, rel: str) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of its entries in directory rel, streamed."""

    def hides(self, rel: str) -> bool:
        """Whether a source path is hidden (the shards themselves)."""


@dataclass(slots=True)
class BytesFile:
    data: bytes
    owner: Owner | None = None  # None: virtual, readable as the source directory is
    path: str = ""  # the source file the bytes were decoded from, if any: errors name it

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


@dataclass(slots=True)
class RangeFile:
    """A byte range of a source file: a raw chunk read straight from its shard, nothing copied in between."""

    store: LocalStore
    path: str
    start: int
    stop: int
    owner: Owner | None = None

    def size(self) -> int:
        return self.stop - self.start

    def read(self, offset: int, length: int) -> bytes:
        start = self.start + offset
        return self.store.read(self.path, start, min(start + length, self.stop))


class Tree:
    """Paths are relative to the mount root, '' being the root itself, with '/' separators."""

    def __init__(
        self, store: LocalStore, cache: ByteCache, files: dict[str, bytes], providers: dict[str, Provider],
        passthrough: bool = True,
    ) -> None:  # fmt: skip
        """passthrough: whether source files the overlay and providers do not name are shown as they are
        (the native view), or nothing but the overlay and providers is (the other views)."""
        self.passthrough = passthrough
        self.store = store
        self.cache = cache
        self.owner = Owner.of(store.stat(""))  # virtual nodes are readable as the source directory is
        self.files = {path: BytesFile(data) for path, data in files.items()}
        self.providers = providers
        self._last: tuple[str | None, Node] = (None, DIR)
        # Overlay entries by parent directory, including the ancestors that the source may lack.
        self._overlay: dict[str, set[str]] = defaultdict(set)
        for path in (*files, *providers):
            while path:
                parent, _, name = path.rpartition("/")
                self._overlay[parent].add(name)
                path = parent

    def lookup(self, path: str) -> Node:
        """The node at path; FileNotFoundError if there is none. Nodes are cached, since every read looks
        up again; the last one is also kept apart, since a read mostly follows the lookup of its file."""
        last = self._last
        if last[0] == path:
            return last[1]
        node = self.cache.get_or_make(("node", path), lambda: self._lookup(path))
        self._last = (path, node)
        return node

    def drop_caches(self) -> None:
        """Forget looked-up nodes, indexes, decoded chunks and open shard files, so a source rewritten
        in place is read afresh. Metadata read at mount time (`info`, `zarr.json`) stays as it was."""
        self.cache.clear()
        self._last = (None, DIR)
        self.store.forget()

    def _lookup(self, path: str) -> Node:
        found = self.files.get(path)
        if found is not None:
            return found
        if not path or path in self._overlay or path in self.providers:
            return DIR
        provider, rel = self._provider_of(path)
        if provider is not None:
            node = provider.child(rel)
            if node is not None:
                return node
            if provider.hides(rel):
                raise FileNotFoundError(path)
        if not self.passthrough:
            raise FileNotFoundError(path)
        return self._source(path)

    def _provider_of(self, path: str) -> tuple[Provider | None, str]:
        """The provider whose directory holds path, nearest first, and path relative to it."""
        parent = path
        while parent:
            parent, _, _ = parent.rpartition("/")
            provider = self.providers.get(parent)
            if provider is not None:
                return provider, path[len(parent) + 1 :] if parent else path
        return None, path

    def _source(self, path: str) -> Node:
        if posixpath.normpath(path) != path or path == ".." or path.startswith("../"):
            raise FileNotFoundError(path)
        st = self.store.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return SourceDir(Owner.of(st))
        if stat.S_ISREG(st.st_mode):
            return RangeFile(self.store, path, 0, st.st_size, Owner.of(st))
        raise FileNotFoundError(path)  # sockets, devices and links are not part of a dataset

    def listdir(self, path: str) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of a directory's entries, streamed: overlay, then the provider's, then the
        source's. Knowing the type spares `find` and `os.walk` a stat of every chunk."""
        overlay = self._overlay.get(path, set())
        for name in sorted(overlay):
            child = f"{path}/{name}" if path else name
            yield name, child not in self.files
        provider, rel = (self.providers[path], "") if path in self.providers else self._provider_of(path)
        if provider is not None:
            yield from provider.entries(rel)
        if not self.passthrough:
            return
        prefix = f"{rel}/" if rel else ""
        for entry in self.store.scandir(path):
            name = entry.name
            if name in overlay or (provider is not None and provider.hides(prefix + name)):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield name, True
            elif entry.is_file(follow_symlinks=False):
                yield name, False
