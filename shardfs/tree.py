"""The virtual filesystem as plain objects: what exists at a path, what a directory lists, what a file reads.

A mount is the source directory passed through, with an overlay of rewritten files (metadata with
sharding removed) and of *providers*: directories whose children are computed from shard indexes.
The FUSE bridge, `shardfs ls`/`cat` and the tests all use this, so FUSE knows nothing of formats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from shardfs.cache import LARGE_VALUE, ByteCache
from shardfs.files import BytesFile, Dir, Node, Provider, RangeFile
from shardfs.stores.protocol import Store


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
        self._last: tuple[str | tuple[int, int] | None, Node | None] = (None, None)  # see lookup
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
        path = self._named(path)
        last = self._last
        if last[0] == path and last[1] is not None:
            return last[1]
        node = self.files.get(path) or self.cache.get_or_make(("node", path), lambda: self._lookup(path), _holds_bytes)
        return self._kept(path, node)

    def file_of(self, number: int, key: int) -> Node:
        """The file `key_of` gave (number, key) for, found from its key with no name made or parsed; kept as
        `lookup` keeps nodes. FileNotFoundError if there is none."""
        numbered = (number, key)
        last = self._last
        if last[0] == numbered and last[1] is not None:
            return last[1]
        if not 0 <= number < len(self.numbered):
            raise FileNotFoundError(f"directory {number}")
        provider = self.providers[self.numbered[number]]
        node = self.cache.get_or_make(("node", number, key), lambda: provider.file_of(key), _holds_bytes)
        return self._kept(numbered, node)

    def _kept(self, found: str | tuple[int, int], node: Node) -> Node:
        """node, found at found, kept apart as the last one found."""
        if getattr(node, "nbytes", 0) <= LARGE_VALUE:  # a large one is the cache's alone to keep or let go
            self._last = (found, node)
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
        metadata, and `file_of` finds the file from them alone. None for a path no provider numbers
        (directories, metadata, files passed through), or that the overlay shows, since its node is the
        overlay's whatever its name."""
        path = self._named(path)
        directory, rel = self._directory_of(path)
        if directory is None or path in self.files:
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
        provider, rel = (self.providers[path], "") if path in self.providers else self._provider_of(path)
        if provider is not None:
            yield from provider.entries(rel)
        if not self.passthrough:
            return
        prefix = f"{rel}/" if rel else ""
        for name, is_dir in self.store.list(path):
            if name not in overlay and not (provider is not None and provider.hides(prefix + name)):
                yield name, is_dir
