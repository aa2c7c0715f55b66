"""A store that cannot list its directories (a web server), shown as the dataset's metadata describes it.

Over HTTP nothing says what a directory holds, so a mount lists what the metadata names: its directories
(scales, meshes, groups, arrays) and the metadata files read. A directory no metadata names is still found by
name where its marker file (zarr.json) is there. Everything else is the wrapped store's.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from cachetools import LRUCache

from shardfs.cache import key_cost
from shardfs.stores.protocol import Store

log = logging.getLogger("shardfs")
BY_NAME = 1 << 20  # bytes of the directories found by name kept; one forgotten is found again from its parents
CHUNK_KEY_DIRECTORY = re.compile(r"c|\d{1,20}")  # a zarr v3 chunk key's directories: `c/0/12/3`
UNLISTED = (
    "a web server cannot list directories: only what the metadata names is listed (scales, meshes, groups and "
    "arrays, their info and zarr.json files, and sharded directories' chunks); other files, such as an "
    "unsharded scale's or array's chunks, are not listed, though each is found by name"
)


class NamedListing:
    """store, its directories listed from names. directories: those the metadata names; files: the metadata
    files read; marker: the metadata file every directory of the format's nodes holds, by which one no
    metadata names is found by name ('' for none); sharded: the directories whose chunks are listed from
    their shards, where a listing misses nothing (not said to be partial)."""

    def __init__(
        self, store: Store, directories: Iterable[str], files: Iterable[str], marker: str, sharded: Iterable[str]
    ) -> None:
        self.store = store
        self._files = frozenset(files)
        self._marker = marker
        self._sharded = frozenset(sharded)
        # Entries by parent directory, including the ancestors that the source may lack; a file named is a file.
        self._children: dict[str, dict[str, bool]] = {}
        for path in (*directories, *self._files):
            while path:
                parent, _, name = path.rpartition("/")
                self._children.setdefault(parent, {})[name] = True
                path = parent
        for path in directories:
            self._children.setdefault(path, {})  # a directory, even with nothing known in it
        for path in self._files:
            parent, _, name = path.rpartition("/")
            self._children[parent][name] = False
        self._by_name: LRUCache[str, bool] = LRUCache(BY_NAME, getsizeof=key_cost)  # see _found_by_name
        self._lock = threading.Lock()
        self._said = False

    def __getattr__(self, name: str) -> Any:
        """Reading, opening and the rest are the wrapped store's, unchanged."""
        return getattr(self.store, name)

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        """What the metadata names in path, by name; the first listing that may miss files says so, once."""
        if not self._said and not self._in_sharded(path):
            self._said = True
            log.warning("%s (first seen listing %s)", UNLISTED, self.store.where(path), extra={"event": "unlisted"})
        yield from sorted(self._children.get(path, {}).items())

    def _in_sharded(self, path: str) -> bool:
        while True:
            if path in self._sharded:
                return True
            if not path:
                return False
            path = path.rpartition("/")[0]

    def type_of(self, path: str) -> str | None:
        if path in self._children:
            return "dir"
        found = self.store.type_of(path)
        if found is None and self._marker and self._found_by_name(path):
            return "dir"
        return found

    def _found_by_name(self, path: str) -> bool:
        """Whether path is a directory where the store cannot say: a node no metadata names, known by its
        marker file (its files then pass through as stored), or inside such a node a name a chunk key's
        directory can have (`c`, or a grid position) that is not an object itself: nothing can tell one from
        an absent name, and the object below it decides. Any other made-up name is absent, and costs nothing
        kept."""
        with self._lock:
            if path in self._by_name:
                return True
        parent, _, name = path.rpartition("/")
        inside = bool(parent) and CHUNK_KEY_DIRECTORY.fullmatch(name) is not None
        inside = inside and parent not in self._files and self.store.type_of(parent) is None
        if not (inside and self._found_by_name(parent)) and self.store.type_of(f"{path}/{self._marker}") != "file":
            return False
        with self._lock:
            self._by_name[path] = True
        return True
