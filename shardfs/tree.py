"""The virtual filesystem as plain objects: what exists at a path, what a directory lists, what a file reads.

A mount is the source directory passed through, with an overlay of rewritten files (metadata with
sharding removed) and of *providers*: directories whose children are computed from shard indexes.
The FUSE adapter, `shardfs ls`/`cat` and the tests all use this, so FUSE knows nothing of formats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from shardfs.cache import LARGE_VALUE, ByteCache, closure_cost, key_cost
from shardfs.stores.protocol import Owner, Store, StoredFile


class File(Protocol):
    owner: Owner

    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Dir:
    """A directory node, searchable as the source directory it stands for; what it lists comes from
    `Tree.listdir`."""

    owner: Owner


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

    def key_of(self, rel: str) -> int | None:
        """A number ≥ 0 naming the path rel, as `child` parses it (a chunk's Morton code, or its index on the
        grid), or None for what has none (directories, names not the provider's). One name, one number: only
        canonical names have one, and `rel_of` gives the name back. Whether it exists is `child`'s to say."""

    def rel_of(self, key: int) -> str | None:
        """The path whose `key_of` is key; None if there is none."""


@dataclass(slots=True)
class BytesFile:
    """Bytes made once (rewritten metadata, a decoded chunk), kept as decoded: a large value is not copied."""

    data: bytes | bytearray
    owner: Owner  # the source file's the bytes come from
    path: str = ""  # that source file, if the bytes were decoded from it: errors name it

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        return bytes(memoryview(self.data)[offset : offset + length])


@dataclass(slots=True)
class LazyFile:
    """A decoded or transcoded chunk whose size is known from metadata alone (raw bytes), so `stat` and
    `ls -l` decode nothing. A file read whole by one request is made and handed over, not kept: the kernel
    keeps its pages (FUSE no_open), so no later read would find it here. One read in pieces makes the bytes
    into the byte-bounded cache, and later pieces share them."""

    length: int
    cache: ByteCache
    key: tuple
    make: Callable[[], Any]  # bytes, or an array of them
    held: int  # what make holds until then: a stored chunk already in memory, or nothing
    owner: Owner  # the stored chunk's, or the array directory's for a block made of the fill value

    @property
    def nbytes(self) -> int:
        """What this node keeps in memory beyond its own object, for the node cache's budget: the stored chunk
        make holds, its key, and make itself, a closure of a few hundred bytes (measured). 0 when make holds no
        stored bytes: such a node is not kept (found again is cheaper), and its closure goes with it."""
        return self.held + key_cost(self.key) + closure_cost(self.make) if self.held else 0

    def size(self) -> int:
        return self.length

    def read(self, offset: int, length: int) -> bytes:
        if offset == 0 and length >= self.length:
            return bytes(self.make())
        return bytes(self.cache.get_or_make(self.key, self.make)[offset : offset + length])


@dataclass(slots=True)
class RangeFile:
    """A byte range of one version of a source file: a raw chunk read straight from its shard, nothing
    copied in between; if the file changed since the range was found, the read fails."""

    file: StoredFile
    start: int
    stop: int

    @property
    def owner(self) -> Owner:
        return self.file.owner

    @property
    def path(self) -> str:
        return self.file.path

    def size(self) -> int:
        return self.stop - self.start

    def read(self, offset: int, length: int) -> bytes:
        start = self.start + offset
        return self.file.read(start, min(start + length, self.stop))


def _holds_bytes(node: Node) -> bool:
    return getattr(node, "nbytes", 0) > 0


class Tree:
    """Paths are relative to the mount root, '' being the root itself, with '/' separators."""

    def __init__(
        self,
        store: Store,
        cache: ByteCache,
        files: dict[str, bytes],
        providers: dict[str, Provider],
        passthrough: bool = True,
    ) -> None:
        """passthrough: whether source files the overlay and providers do not name are shown as they are
        (the native view), or nothing but the overlay and providers is (the other views)."""
        self.passthrough = passthrough
        self.store = store
        self.cache = cache
        self.files = {path: BytesFile(data, store.owner(path)) for path, data in files.items()}
        self.providers = providers
        # Directory numbers of the providers, the same on every mount of the same metadata.
        self.numbered = sorted(providers)
        self._numbers = {directory: number for number, directory in enumerate(self.numbered)}
        self._last: tuple[str | None, Node | None] = (None, None)
        # Overlay entries by parent directory, including the ancestors that the source may lack.
        self._overlay: dict[str, set[str]] = defaultdict(set)
        for path in (*files, *providers):
            while path:
                parent, _, name = path.rpartition("/")
                self._overlay[parent].add(name)
                path = parent

    def lookup(self, path: str) -> Node:
        """The node at path; FileNotFoundError if there is none. The last one is kept apart, since a read
        mostly follows the lookup of its file. Of the others only those holding bytes are kept, in the cache,
        decoded once for every read: a chunk that is a range of its shard or is decoded when read, a file
        passed through, a directory, are found again from the cached indexes and the store's open files for
        less than keeping them costs (about 1 KiB each, for as many files as the kernel looked up)."""
        last = self._last
        if last[0] == path and last[1] is not None:
            return last[1]
        node = self.files.get(path) or self.cache.get_or_make(("node", path), lambda: self._lookup(path), _holds_bytes)
        if getattr(node, "nbytes", 0) <= LARGE_VALUE:  # a large one is the cache's alone to keep or let go
            self._last = (path, node)
        return node

    def drop_caches(self) -> None:
        """Forget looked-up nodes, indexes, decoded chunks and open shard files, so a source rewritten
        in place is read afresh. Metadata read at mount time (`info`, `zarr.json`) stays as it was."""
        self.cache.clear()
        self._last = (None, None)
        self.store.forget()

    def _lookup(self, path: str) -> Node:
        if not path or path in self._overlay or path in self.providers:
            return Dir(self.store.owner(path))
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
        directory, rel = self._directory_of(path)
        return (None, path) if directory is None else (self.providers[directory], rel)

    def _directory_of(self, path: str) -> tuple[str | None, str]:
        """The directory of the provider that holds path, nearest first, and path relative to it."""
        parent = path
        while parent:
            parent, _, _ = parent.rpartition("/")
            if parent in self.providers:
                return parent, path[len(parent) + 1 :] if parent else path
        return None, path

    def key_of(self, path: str) -> tuple[int, int] | None:
        """(number of a provider's directory, key) naming path below it (a chunk): the two give the path back
        (`path_of`), so nothing need be kept to find it again, and the same on every mount of the same
        metadata. None for a path no provider numbers (directories, metadata, files passed through)."""
        directory, rel = self._directory_of(path)
        if directory is None:
            return None
        key = self.providers[directory].key_of(rel)
        return None if key is None else (self._numbers[directory], key)

    def path_of(self, number: int, key: int) -> str | None:
        """The path `key_of` gave (number, key) for; None if it gave none."""
        if not 0 <= number < len(self.numbered):
            return None
        directory = self.numbered[number]
        rel = self.providers[directory].rel_of(key)
        if rel is None:
            return None
        return f"{directory}/{rel}" if directory else rel

    def _source(self, path: str) -> Node:
        kind = self.store.kind(path)  # sockets, devices and links are not part of a dataset
        if kind == "dir":
            return Dir(self.store.owner(path))
        if kind == "file":
            file = self.store.open(path)
            return RangeFile(file, 0, file.size)
        raise FileNotFoundError(path)

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
        for name, is_dir in self.store.list(path):
            if name not in overlay and not (provider is not None and provider.hides(prefix + name)):
                yield name, is_dir
