"""The virtual filesystem as plain objects: what exists at a path, what a directory lists, what a file reads.

A mount is the source directory passed through, with an overlay of rewritten files (metadata with
sharding removed) and of *providers*: directories whose children are computed from shard indexes.
The FUSE bridge, `shardfs ls`/`cat` and the tests all use this, so FUSE knows nothing of formats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shardfs.cache import LARGE_VALUE, ByteCache
from shardfs.files import BytesFile, Dir, Node, Provider, RangeFile
from shardfs.request import OWN, Request
from shardfs.stores.protocol import Store


def _holds_bytes(node: Node) -> bool:
    return getattr(node, "nbytes", 0) > 0


Numbered = tuple[int, int]  # (number of a provider's directory, key of a file below it): `Tree.child`


@dataclass(frozen=True, slots=True)
class Located:
    """A path with the provider directory nearest above it, found once: a name in it is then found with no walk
    up the path (`Tree.child`), as go-fuse's bridge asks the parent inode, not a path."""

    path: str
    number: int | None  # of the provider directory nearest above path (`Tree.numbered`); None if none holds it


Place = Located | Numbered  # where a node is: a numbered file's key, or a path located


class Tree:
    """Paths are relative to the mount root, '' being the root itself, with '/' separators."""

    def __init__(
        self,
        store: Store,
        cache: ByteCache,
        files: dict[str, bytes],
        providers: dict[str, Provider],
        passthrough: bool = True,
        aliases: dict[str, str] | None = None,
    ) -> None:
        """passthrough: whether source files the overlay and providers do not name are shown as they are
        (the native view), or nothing but the overlay and providers is (the other views). aliases: other
        names of directories (`Plan.aliases`), found by lookup and never listed."""
        self.passthrough = passthrough
        self.aliases = aliases or {}
        self.store = store
        self.cache = cache
        self.files = {path: BytesFile(data, store.owner(path)) for path, data in files.items()}
        self.providers = providers
        # Directory numbers of the providers, the same on every mount of the same metadata.
        self.numbered = sorted(providers)
        self._numbers = {directory: number for number, directory in enumerate(self.numbered)}
        self._last: tuple[Place | None, Node | None] = (None, None)  # see node
        # Overlay entries by parent directory, including the ancestors that the source may lack.
        self._overlay: dict[str, set[str]] = defaultdict(set)
        for path in (*files, *providers):
            while path:
                parent, _, name = path.rpartition("/")
                self._overlay[parent].add(name)
                path = parent

    @property
    def numbers(self) -> int:
        """How many directories may be numbered (fs/nodes.py packs a number below it): a dataset's, fixed."""
        return len(self.numbered)

    def numbering(self, numbered: list[str], journal: Callable[[str], None]) -> None:
        """A dataset's numbers are its metadata's, the same for every daemon: none to restore or journal (a
        directory of datasets numbers as it is browsed: collection.py)."""

    def number_of(self, directory: str) -> int | None:
        """The number of a provider's directory; None if no provider has it."""
        return self._numbers.get(directory)

    def provider(self, number: int) -> Provider:
        """The provider of directory number."""
        return self.providers[self.numbered[number]]

    def lookup(self, path: str, request: Request = OWN) -> Node:
        """The node at path; FileNotFoundError if there is none."""
        return self.node(self.locate(path), request)

    def node(self, place: Place, request: Request = OWN) -> Node:
        """The node at place, found for request (what it decodes is counted against it; interrupted while it waits on
        the network, it gives up); FileNotFoundError if there is none. A numbered file is found from its key with no
        name made or parsed. The last node is kept apart, since a read mostly follows the lookup of its file. Of the
        others only those holding bytes are kept, in the cache, decoded once for every read: a chunk that is a range of
        its shard or is decoded when read, a file passed through, a directory, are found again from the cached indexes
        and the store's open files for less than keeping them costs (about 1 KiB each, for as many files as the kernel
        looked up)."""
        last = self._last
        if last[0] == place and last[1] is not None:
            return last[1]
        if isinstance(place, Located):
            node = self.files.get(place.path) or self.cache.get_or_make(
                ("node", place.path), lambda: self._lookup(place, request), _holds_bytes
            )
        else:
            number, key = place
            if not 0 <= number < len(self.numbered):
                raise FileNotFoundError(f"directory {number}")
            provider = self.providers[self.numbered[number]]
            node = self.cache.get_or_make(("node", number, key), lambda: provider.file_of(key, request), _holds_bytes)
        if getattr(node, "nbytes", 0) <= LARGE_VALUE:  # a large one is the cache's alone to keep or let go
            self._last = (place, node)
        return node

    def drop_caches(self) -> None:
        """Forget looked-up nodes, indexes, decoded chunks and open shard files, so a source rewritten
        in place is read afresh. Metadata read at mount time (`info`, `zarr.json`) stays as it was."""
        self.cache.clear()
        self._last = (None, None)
        self.store.forget()

    def _named(self, path: str) -> str:
        """path, with the alias it lies below replaced by the directory the alias names."""
        head = path if self.aliases else ""
        while head:
            if head in self.aliases:
                return self.aliases[head] + path[len(head) :]
            head = head.rpartition("/")[0]
        return path

    def _lookup(self, place: Located, request: Request) -> Node:
        path = place.path
        if not path or path in self._overlay or path in self.providers:
            return Dir(self.store.owner(path))
        if place.number is not None:
            provider, rel = self._within(place.number, path)
            node = provider.child(rel, request)
            if node is not None:
                return node
            if provider.hides(rel):
                raise FileNotFoundError(path)
        if not self.passthrough:
            raise FileNotFoundError(path)
        return self._source(path)

    def locate(self, path: str) -> Located:
        """path (its alias's directory, if it is one) with the provider directory nearest above it, found by
        walking up the path once."""
        path = self._named(path)
        parent = path
        while parent:
            parent, _, _ = parent.rpartition("/")
            if parent in self._numbers:
                return Located(path, self._numbers[parent])
        return Located(path, None)

    def child(self, parent: Located, name: str) -> Place:
        """Where name in directory parent is, with no walk up: a chunk's (number of its provider's directory,
        key), which give its path back (`path_of`) and its file (`node`), the same on every mount of the same
        metadata, so nothing need be kept to find it again; else its path located. A name the overlay shows
        is located whatever its provider would make of it, since its node is the overlay's."""
        path = f"{parent.path}/{name}" if parent.path else name
        if self.aliases and self._named(path) != path:  # an alias: found where it names, walked up once
            located = self.locate(path)
        else:
            located = Located(path, self._numbers.get(parent.path, parent.number))
        if located.number is not None and located.path not in self.files:
            provider, rel = self._within(located.number, located.path)
            key = provider.key_of(rel)
            if key is not None:
                return located.number, key
        return located

    def _within(self, number: int, path: str) -> tuple[Provider, str]:
        """The provider of directory number, and path relative to that directory."""
        directory = self.numbered[number]
        return self.providers[directory], path[len(directory) + 1 :] if directory else path

    def path_of(self, number: int, key: int) -> str | None:
        """The path `child` gave (number, key) for; None if it gave none."""
        if not 0 <= number < len(self.numbered):
            return None
        directory = self.numbered[number]
        rel = self.providers[directory].rel_of(key)
        if rel is None:
            return None
        return f"{directory}/{rel}" if directory else rel

    def _source(self, path: str) -> Node:
        found = self.store.type_of(path)  # sockets, devices and links are not part of a dataset
        if found == "dir":
            return Dir(self.store.owner(path))
        if found == "file":
            file = self.store.open(path)
            return RangeFile(file, 0, file.size)
        raise FileNotFoundError(path)

    def listdir(self, path: str) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of a directory's entries, streamed: overlay, then the provider's, then the
        source's. Knowing the type spares `find` and `os.walk` a stat of every chunk."""
        path = self._named(path)
        overlay = self._overlay.get(path, set())
        for name in sorted(overlay):
            child = f"{path}/{name}" if path else name
            yield name, child not in self.files
        if path in self.providers:
            provider, rel = self.providers[path], ""
        else:
            number = self.locate(path).number
            provider, rel = (None, path) if number is None else self._within(number, path)
        if provider is not None:
            yield from provider.entries(rel)
        if not self.passthrough:
            return
        prefix = f"{rel}/" if rel else ""
        for name, is_dir in self.store.list(path):
            if name not in overlay and not (provider is not None and provider.hides(prefix + name)):
                yield name, is_dir
