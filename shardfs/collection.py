"""A source that is no dataset itself (a data directory, a bucket, a prefix): shown as its store lists it, and
every dataset below it as a mount of that dataset alone would show it.

Nothing is crawled at mount: a directory is looked at (its `zarr.json` and `info` asked for) when a path below
it is first looked up, or it is listed, and the verdict is kept, bounded. The outermost dataset decides: below
a dataset's root its own tree answers everything (an OME-Zarr's labels, a precomputed image's meshes). The
datasets opened are kept within OPEN_BYTES of what each holds (measured once opened: its metadata, its plan,
tables such as a precomputed scale's Morton code's) and OPEN at most, least recently used let go and opened
again when wanted; their caches share the mount's one budget (cache.Scoped). A directory whose metadata cannot
be opened shows as plain files, said once in the log (and by `shardfs info`), never as a failed mount.

A dataset's own mount numbers its sharded directories from its metadata, at start, and a chunk file's node id
packs that number and its key (fs/nodes.py). Here datasets are found as they are browsed: each sharded
directory gets the next number when a chunk below it is first named, the same for the mount's life (a dataset
let go and opened again finds its numbers as they were), and journalled in the connection's record so that a
daemon after this one reads the kernel's ids as this one meant them. Numbers take NUMBER_BITS of an id; past
NUMBERS directories, or for a key too large for the bits left, a file gets a table id, as every file did.
"""

from __future__ import annotations

import gc
import itertools
import logging
import sys
import threading
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from cachetools import LRUCache

from shardfs.cache import ByteCache, Scoped, key_cost
from shardfs.errors import SourceError, SourceMissing
from shardfs.files import Node, Provider
from shardfs.request import OWN, Request
from shardfs.stores.beneath import Beneath
from shardfs.stores.protocol import Store
from shardfs.tree import Located, Place, Tree

log = logging.getLogger("shardfs")
OPEN = 16  # datasets kept open at once, at most
# Bytes the datasets kept open hold, at most (one larger than this is kept alone). Measured (tracemalloc; the
# walk of `held_bytes` finds 90% of it): a precomputed image of 20 sharded scales 630 KiB, 29 KiB a scale's
# Morton tables; a zarr hierarchy of 200 sharded arrays 780 KiB, 3.9 KiB an array. 8 MiB keeps 16 datasets of up
# to half a MiB, within the 40 MiB the README gives the daemon beyond --cache-size.
OPEN_BYTES = 8 << 20
NUMBER_BITS = 14  # of a node id, numbering a sharded directory: keys up to 2^49 (a 3-d grid 2^16 chunks a side)
NUMBERS = 1 << NUMBER_BITS  # sharded directories numbered in the mount's life (about 200 bytes each, kept)
DEPTH = 16  # directories below the source where datasets are looked for; deeper ones are plain directories
VERDICTS = 1 << 20  # bytes of verdicts kept (whether a directory is a dataset); one let go is asked again
LOOKED = 10_000  # directories `datasets` looks at, at most
GATES = 64  # datasets opened at once; a directory waits only for another that shares its gate

Opener = Callable[[Store, Scoped], Tree]
Examiner = Callable[[Store, Scoped], str]  # what the dataset at a store's root is, in a few words; raises as Opener


class Collection(Tree):
    """The store passed through as a tree with no overlay, but where a directory is a dataset, its own tree.
    open_dataset: the tree of the dataset at a store's root, in the mount's view; SourceMissing if there is none
    there, SourceError if it cannot be opened (it is then shown as plain files); any other error is the
    lookup's (a network's: the next lookup tries again). examine: what that dataset is, for `datasets`."""

    numbers = NUMBERS

    def __init__(self, store: Store, cache: ByteCache, open_dataset: Opener, examine: Examiner) -> None:
        super().__init__(store, cache, {}, {})
        self._open_dataset = open_dataset
        self._examine = examine
        # Each verdict is kept with its directory's path, which its size counts (cachetools sizes values only).
        self._verdicts: LRUCache[str, tuple[str, bool]] = LRUCache(VERDICTS, getsizeof=key_cost)
        # Each dataset counted at what it holds, and at least an OPEN'th of the bytes: OPEN of them at most.
        self._open: LRUCache[str, tuple[Tree, int]] = LRUCache(OPEN_BYTES, getsizeof=lambda kept: kept[1])
        self._lock = threading.Lock()  # over the two LRUs, never across I/O
        self._gates = [threading.Lock() for _ in range(GATES)]
        self._number_of: dict[str, int] = {}  # a sharded directory's (a path of the source) number in `numbered`
        self._numbering = threading.Lock()
        self._journal: Callable[[str], None] | None = None
        self._spent = False  # NUMBERS given: said once

    def numbering(self, numbered: list[str], journal: Callable[[str], None]) -> None:
        """The numbers a daemon before gave, given again; a number given from now on is journalled first."""
        with self._numbering:
            self.numbered[:] = numbered[:NUMBERS]
            self._number_of = {directory: number for number, directory in enumerate(self.numbered)}
            self._journal = journal

    def child(self, parent: Located, name: str) -> Place:
        """A chunk's (number, key), its sharded directory numbered now if it was not yet; any other path (and,
        past NUMBERS, a chunk's) located."""
        path = f"{parent.path}/{name}" if parent.path else name
        found = self._dataset_of(path, itself=False)
        if found is None:
            return Located(path, None)
        directory, tree = found
        place = tree.child(tree.locate(path[len(directory) + 1 :].rpartition("/")[0]), name)
        if isinstance(place, Located):
            return Located(path, None)
        within = tree.numbered[place[0]]
        number = self._number(f"{directory}/{within}" if within else directory)
        return Located(path, None) if number is None else (number, place[1])

    def _number(self, directory: str) -> int | None:
        """The number of a sharded directory (a path of the source), the next one if it has none yet; None once
        NUMBERS are given."""
        number = self._number_of.get(directory)
        if number is not None:
            return number
        with self._numbering:
            number = self._number_of.get(directory)
            if number is None and len(self.numbered) < NUMBERS:
                if self._journal is not None:
                    self._journal(directory)  # before any id names it
                number = len(self.numbered)
                self.numbered.append(directory)
                self._number_of[directory] = number
            elif number is None and not self._spent:
                self._spent = True
                log.warning("%d sharded directories numbered: chunk files below others get table ids (memory for"
                            " each file the kernel holds, and no read-ahead) until the mount ends", NUMBERS,
                            extra={"event": "numbers_spent", "path": "/" + directory})  # fmt: skip
        return number

    def _numbered_in(self, number: int) -> tuple[str, Tree, int]:
        """The dataset holding sharded directory number (its directory, and its tree, opened if need be), and
        the number its tree gives that directory; FileNotFoundError if it holds it no more (its metadata
        rewritten, and the caches dropped)."""
        path = self.numbered[number] if 0 <= number < len(self.numbered) else ""
        found = self._dataset_of(path, itself=True) if path else None
        if found is not None:
            directory, tree = found
            within = tree.number_of(path[len(directory) + 1 :])
            if within is not None:
                return directory, tree, within
        raise FileNotFoundError(f"sharded directory {number}")

    def provider(self, number: int) -> Provider:
        _, tree, within = self._numbered_in(number)
        return tree.provider(within)

    def path_of(self, number: int, key: int) -> str | None:
        try:
            directory, tree, within = self._numbered_in(number)
        except FileNotFoundError:
            return None
        path = tree.path_of(within, key)
        return None if path is None else f"{directory}/{path}"

    def node(self, place: Place, request: Request = OWN) -> Node:
        """A dataset's root is its source directory (the plain tree's node), so only the directories above
        place are asked whether they are datasets: a file's lookup asks nothing of the file. A chunk's
        (number, key) is its dataset's, by the number its dataset gives its directory."""
        if not isinstance(place, Located):
            _, tree, within = self._numbered_in(place[0])
            return tree.node((within, place[1]), request)
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

    def datasets(self) -> Iterator[tuple[str, str | SourceError]]:
        """The directories below the root that hold a dataset (outermost ones), breadth first and by name, each
        with what it is (examine's words) or why it cannot be opened (the mount shows it as plain files, and
        so the walk goes on below it), for `shardfs info` and `check`: a walk that looks at LOOKED directories at
        most, within DEPTH. Each is examined afresh: the datasets the mount keeps open are neither used nor let go."""
        pending, looked = deque([""]), 0
        while pending and looked < LOOKED:
            at = pending.popleft()
            found = (name for name, is_dir in self.store.list(at) if is_dir)
            for name in sorted(itertools.islice(found, LOOKED - looked)):
                looked += 1
                path = f"{at}/{name}" if at else name
                what: str | SourceError | None
                try:
                    what = self._examine(Beneath(self.store, path), Scoped(self.cache, path))
                except SourceMissing:
                    what = None
                except SourceError as e:
                    what = e
                if what is not None:
                    yield path, what
                if not isinstance(what, str) and path.count("/") + 1 < DEPTH:
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
            # Sized before it is shared (a walk of objects no other thread holds yet), outside the lock.
            held = 0 if tree is None else held_bytes(tree, (self.store, self.cache))
            with self._lock:
                self._verdicts[directory] = (directory, tree is not None)
                if tree is not None:
                    self._open[directory] = (tree, min(max(held, OPEN_BYTES // OPEN), OPEN_BYTES))
            if tree is not None:
                log.debug("dataset opened, holding %d KiB", held >> 10,
                          extra={"event": "dataset_opened", "path": "/" + directory})  # fmt: skip
            return tree

    def _known(self, directory: str) -> tuple[bool, Tree | None]:
        """Whether what directory is is known (no dataset, or one open), and its tree if it is one open."""
        with self._lock:
            kept, verdict = self._open.get(directory), self._verdicts.get(directory)
        if kept is not None:
            return True, kept[0]
        return verdict is not None and not verdict[1], None

    def _opened(self, directory: str) -> Tree | None:
        try:
            return self._open_dataset(Beneath(self.store, directory), Scoped(self.cache, directory))
        except SourceMissing:
            return None  # a source directory that is no dataset
        except SourceError as e:
            log.warning("%s; shown as plain files, not as a dataset", e,
                        extra={"event": "not_a_dataset", "path": "/" + directory})  # fmt: skip
            return None


def held_bytes(root: object, shared: Iterable[object]) -> int:
    """The bytes of the objects root holds that nothing shared holds for it: every object reachable from root
    (sys.getsizeof each, once), not through shared ones, classes, modules or code, nor through a function's
    globals (its closure and defaults are its own)."""
    seen = {id(obj) for obj in shared}
    pending, total = [root], 0
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.CodeType | types.BuiltinFunctionType):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, types.FunctionType):
            pending += [*(obj.__closure__ or ()), *(obj.__defaults__ or ())]
        else:
            pending += gc.get_referents(obj)
    return total
