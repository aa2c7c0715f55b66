"""A source that is no dataset itself (a data directory, a bucket, a prefix): shown as its store lists it, and
every dataset below it as a mount of that dataset alone would show it.

Nothing is crawled at mount: a directory is looked at (its `zarr.json` and `info` asked for) when a path below
it is first looked up, or it is listed, and the verdict is kept, bounded. The outermost dataset decides: below
a dataset's root its own tree answers everything (an OME-Zarr's labels, a precomputed image's meshes). A few
opened datasets are kept, least recently used let go and opened again when wanted; their caches share the
mount's one budget (cache.Scoped). A directory whose metadata cannot be opened shows as plain files, said once
in the log, never as a failed mount.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator

from cachetools import LRUCache

from shardfs.cache import ByteCache, Scoped, key_cost
from shardfs.errors import SourceError, SourceMissing
from shardfs.files import Node
from shardfs.request import OWN, Request
from shardfs.stores.beneath import Beneath
from shardfs.stores.protocol import Store
from shardfs.tree import Located, Place, Tree

log = logging.getLogger("shardfs")
OPEN = 16  # datasets kept open at once
DEPTH = 16  # directories below the source where datasets are looked for; deeper ones are plain directories
VERDICTS = 1 << 20  # bytes of verdicts kept (whether a directory is a dataset); one let go is asked again
LOOKED = 10_000  # directories `datasets` looks at, at most
GATES = 64  # datasets opened at once; a directory waits only for another that shares its gate

Opener = Callable[[Store, Scoped], Tree]


class Collection(Tree):
    """The store passed through as a tree with no overlay, but where a directory is a dataset, its own tree.
    open_dataset: the tree of the dataset at a store's root, in the mount's view; SourceMissing if there is none
    there, SourceError if it cannot be opened (it is then shown as plain files); any other error is the
    lookup's (a network's: the next lookup tries again)."""

    def __init__(self, store: Store, cache: ByteCache, open_dataset: Opener) -> None:
        super().__init__(store, cache, {}, {})
        self._open_dataset = open_dataset
        # Each verdict is kept with its directory's path, which its size counts (cachetools sizes values only).
        self._verdicts: LRUCache[str, tuple[str, bool]] = LRUCache(VERDICTS, getsizeof=key_cost)
        self._open: LRUCache[str, Tree] = LRUCache(OPEN)
        self._lock = threading.Lock()  # over the two LRUs, never across I/O
        self._gates = [threading.Lock() for _ in range(GATES)]

    def node(self, place: Place, request: Request = OWN) -> Node:
        """A dataset's root is its source directory (the plain tree's node), so only the directories above
        place are asked whether they are datasets: a file's lookup asks nothing of the file. A collection
        numbers nothing (no providers of its own): every place is a path."""
        assert isinstance(place, Located), place
        found = self._dataset_of(place.path, itself=False)
        if found is None:
            return super().node(place, request)
        directory, tree = found
        return tree.lookup(place.path[len(directory) + 1 :], request)

    def listdir(self, path: str) -> Iterator[tuple[str, bool]]:
        found = self._dataset_of(path, itself=True)
        if found is None:
            return super().listdir(path)
        directory, tree = found
        return tree.listdir(path[len(directory) + 1 :])

    def datasets(self) -> Iterator[str]:
        """The directories below the root that are datasets (outermost ones), breadth first and by name, for
        `shardfs info` and `check`: a walk that looks at LOOKED directories at most, within DEPTH."""
        pending, looked = deque([""]), 0
        while pending and looked < LOOKED:
            at = pending.popleft()
            found = (name for name, is_dir in self.store.list(at) if is_dir)
            for name in sorted(itertools.islice(found, LOOKED - looked)):
                looked += 1
                path = f"{at}/{name}" if at else name
                if self._dataset(path) is not None:
                    yield path
                elif path.count("/") + 1 < DEPTH:
                    pending.append(path)

    def drop_caches(self) -> None:
        """Datasets are opened afresh too: their metadata may have been rewritten with the rest."""
        super().drop_caches()
        with self._lock:
            self._open.clear()
            self._verdicts.clear()

    def _dataset_of(self, path: str, itself: bool) -> tuple[str, Tree] | None:
        """The outermost dataset holding path (its directory and tree), path itself counted if itself, within
        DEPTH directories of the source's root; None if path is in no dataset."""
        parts = path.split("/") if path else []
        for n in range(1, min(len(parts) - (not itself), DEPTH) + 1):
            directory = "/".join(parts[:n])
            if (tree := self._dataset(directory)) is not None:
                return directory, tree
        return None

    def _dataset(self, directory: str) -> Tree | None:
        """The opened dataset at directory, opened now if need be; None if it is none, or cannot be opened."""
        known, tree = self._known(directory)
        if known:
            return tree
        with self._gates[hash(directory) % GATES]:  # one thread opens a given directory; others wait for it
            known, tree = self._known(directory)
            if known:
                return tree
            tree = self._opened(directory)
            with self._lock:
                self._verdicts[directory] = (directory, tree is not None)
                if tree is not None:
                    self._open[directory] = tree
            return tree

    def _known(self, directory: str) -> tuple[bool, Tree | None]:
        """Whether what directory is is known (no dataset, or one open), and its tree if it is one open."""
        with self._lock:
            tree, verdict = self._open.get(directory), self._verdicts.get(directory)
        return tree is not None or (verdict is not None and not verdict[1]), tree

    def _opened(self, directory: str) -> Tree | None:
        try:
            return self._open_dataset(Beneath(self.store, directory), Scoped(self.cache, directory))
        except SourceMissing:
            return None  # a source directory that is no dataset
        except SourceError as e:
            log.warning("%s; shown as plain files, not as a dataset", e,
                        extra={"event": "not_a_dataset", "path": "/" + directory})  # fmt: skip
            return None
