"""Read-ahead across files: a directory's files read in its listing's order (`cp -r`, rsync, a loop over
`os.listdir`) have the next ones' chunks fetched before the kernel asks for them.

The kernel asks for one file at a time per reader, and over a network each cold file costs a round trip. The
daemon knows what the kernel cannot: the directory's sorted listing (it made it), and where each file's bytes
lie. When a file is read that follows the one read before in the same directory (within GAP entries), twice in
a row, the pattern holds and a window of the files after it is fetched ahead, at most AT_ONCE fetches in flight
for the mount and QUEUED asked for (a window's batch waits its turn rather than being asked again). The window
doubles while the pattern holds (from 2 up to the mount's `read_ahead`, 64 files by default) and is dropped
when it breaks; it is filled again once half of it has been read, so that the keys fetched together (below)
are many, not one a read. What is fetched lies in the byte-bounded cache under its shard's version, like any
read: a changed source fails as a direct read would, and a fetch that fails is nobody's
error (the real read, if it comes, goes to the store). Keys one index locates (a minishard's, a zarr shard's)
are fetched together, their ranges that lie close in one request (shards/kv.py); a file read while its fetch
reads it waits for those bytes rather than asking for them again. Chunk keys nested in
directories (zarr's `c/0/1/2`, the views') follow their own directory's listing. Only over a network (a local
disk answers a read in less than the bookkeeping would cost), and only where the provider has keys to fetch
(`prefetch`: a source's unsharded files have none).

A volume read as a viewer reads it (a window of chunks, then the window panned) is also read ahead across
space: a chunk read in line after two read before, along an axis, has the REACH chunks past that line
fetched (`_around`), so that the window's next pan finds them fetched. Random chunks seldom line up: they fetch
next to nothing.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cachetools import LRUCache

from shardfs import logs
from shardfs.files import Provider
from shardfs.fuse.listing import Listing
from shardfs.metrics import Metrics
from shardfs.shards.kv import Fetch
from shardfs.tree import Tree

log = logging.getLogger("shardfs")

GAP = 4  # a read this many entries past the last one still follows it (readers a few files apart)
REACH = 2  # chunks fetched past a region's edge, along each axis it was read across (a viewer pans a few)
LINE = 32  # chunks read in a row walked to find that edge
FOLLOWED = 2  # reads in a row that follow one another before anything is fetched (random reads seldom do twice)
FIRST_WINDOW = 2
AT_ONCE = 16  # fetches ahead in flight for the mount (each a group of keys one index locates)
QUEUED = 64  # fetches ahead asked for and not yet done (in flight or waiting their turn) for the mount
REMEMBERED = 4096  # directories and fetched keys remembered (a few hundred KiB at most)
FETCHING = -1  # in ReadAhead._fetched: a fetch of the key is under way
READ_MEANWHILE = -2  # ... and its file began to be read meanwhile (it waits for those bytes: shards/kv.py)


@dataclass
class _Pattern:
    last: int  # the listing offset of the last file read
    run: int = 0  # reads in a row that followed the one before
    window: int = 0  # files fetched ahead of it (0: no pattern yet)
    ahead: int = 0  # the offset up to which fetches were asked


class ReadAhead:
    """The read-ahead of one mount (see the module's docstring); most: the largest window, 0 for none."""

    def __init__(self, tree: Tree, metrics: Metrics, most: int) -> None:
        self.tree, self.metrics, self.most = tree, metrics, most
        self._patterns: LRUCache[tuple[int, str], _Pattern] = LRUCache(REMEMBERED)  # by directory
        # (number, key) fetched and not read yet: its bytes, or FETCHING / READ_MEANWHILE
        self._fetched: LRUCache[tuple[int, int], int] = LRUCache(REMEMBERED)
        self._read: LRUCache[tuple[int, tuple[int, ...]], bool] = LRUCache(REMEMBERED)  # (number, position) read
        self._asked: LRUCache[tuple[int, int], bool] = LRUCache(REMEMBERED)  # (number, key) asked for by position
        self._looked_up: LRUCache[tuple[int, int], bool] = LRUCache(REMEMBERED)  # (number, key): a read will come
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(QUEUED)
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def read(self, number: int, key: int) -> None:
        """A numbered file's first bytes are being read: count it used if it was fetched ahead (or once its
        fetch under way ends), and fetch the next files of its directory if the pattern holds."""
        if not self.most:
            return
        with self._lock:
            fetched = self._fetched.pop((number, key), None)
            if fetched == FETCHING:
                self._fetched[(number, key)] = READ_MEANWHILE
        if fetched is not None and fetched >= 0:
            self._used([fetched])
        provider = self.tree.provider(number)  # a directory of datasets' opens its dataset if need be
        rel = provider.rel_of(key)
        parent, name = posixpath.split(rel or "")  # a chunk key's own directory (zarr's c/0/1, N5's 0/1)
        listing = self.tree.cache.get(("listing", posixpath.join(self.tree.numbered[number], parent).strip("/")))
        position = listing.position(name.encode()) if rel and isinstance(listing, Listing) else None
        with self._lock:
            todo = range(0) if position is None else self._advance((number, parent), position, len(listing))
            pattern = self._patterns.get((number, parent))
        # Read across space unless the listing's order is followed (which fetches what comes next already).
        self._around(number, key, provider, fetch=pattern is None or not pattern.window)
        keys: dict[int, int] = {}  # key → its offset in the listing
        for offset in todo:
            entry, is_dir = listing.entry(offset)
            found = None if is_dir else provider.key_of(posixpath.join(parent, entry.decode()))
            if found is not None:
                keys.setdefault(found, offset)
        for fetch in provider.prefetch(list(keys)) if keys else ():
            if not self._fetch(number, fetch):  # every slot busy: the next read asks again from its first file
                with self._lock:
                    pattern = self._patterns.get((number, parent))
                    if pattern is not None:
                        pattern.ahead = min([pattern.ahead, *(keys[k] for k in fetch.keys if k in keys)])

    def looked_up(self, number: int, key: int) -> None:
        """The kernel looked a numbered file up: whoever did reads it next, so fetching it ahead across space
        would only race that read (its own request)."""
        if self.most:
            with self._lock:
                self._looked_up[(number, key)] = True

    def _around(self, number: int, key: int, provider: Provider, fetch: bool) -> None:
        """A chunk read in line after two read before, along an axis: the region read grows that way (a
        viewer's window, panned), so the REACH chunks past its edge along that axis (past the chunks read in a
        row after this one) are fetched, unless read or asked for already. Random reads seldom line up three
        chunks: they fetch next to nothing."""
        position = provider.position_of(key)
        if position is None:
            return
        ahead = []
        with self._lock:
            self._read[(number, position)] = True
            for axis in range(len(position) if fetch else 0):
                for step in (1, -1):
                    if any((number, _moved(position, axis, -step * k)) not in self._read for k in (1, 2)):
                        continue  # not a line read from that side (random reads seldom make one)
                    edge = position  # the last chunk read along this line (readers take a window in any order)
                    for _ in range(LINE):
                        if (number, _moved(edge, axis, step)) not in self._read:
                            break
                        edge = _moved(edge, axis, step)
                    for reach in range(1, REACH + 1):
                        there = _moved(edge, axis, step * reach)
                        found = provider.key_at(there)
                        if found is None:
                            break  # off the grid
                        if (number, found) in self._asked or (number, found) in self._looked_up:
                            continue
                        if (number, there) not in self._read:
                            ahead.append(found)
                            self._asked[(number, found)] = True
        for fetch in provider.prefetch(ahead) if ahead else ():
            self._fetch(number, fetch)

    def _advance(self, directory: tuple[int, str], position: int, end: int) -> range:
        """The listing offsets to fetch now, as the pattern of directory moves to position."""
        pattern = self._patterns.get(directory)
        if pattern is None or not 0 < position - pattern.last <= GAP:
            if pattern is None or position != pattern.last:
                self._patterns[directory] = _Pattern(position)
            return range(0)
        pattern.last, pattern.run = position, pattern.run + 1
        if pattern.run < FOLLOWED:
            return range(0)
        pattern.window = min(max(FIRST_WINDOW, 2 * pattern.window), self.most)
        if pattern.ahead - (position + 1) > pattern.window // 2:  # enough asked for ahead: ask in batches
            return range(0)
        start = max(position + 1, pattern.ahead)
        pattern.ahead = min(position + 1 + pattern.window, end)
        return range(start, pattern.ahead)

    def _fetch(self, number: int, fetch: Fetch) -> bool:
        """Run one fetch in the pool, if a slot is free; False if none is."""
        if self._closed or not self._slots.acquire(blocking=False):
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(  # its threads work for this mount (see logs.own_thread)
                AT_ONCE, thread_name_prefix="shardfs-read-ahead", initializer=logs.own_thread,
                initargs=(logs.thread_mount(),),
            )  # fmt: skip

        def run() -> None:
            fetched: dict = {}
            with self._lock:
                self._fetched.update(((number, key), FETCHING) for key in fetch.keys)
            try:
                fetched = fetch.run()
                self.metrics.read_ahead.labels("fetched").inc(len(fetched))
                self.metrics.read_ahead_bytes.labels("fetched").inc(sum(fetched.values()))
            except Exception as e:  # nobody's error: the real reads go to the store
                self.metrics.read_ahead.labels("failed").inc(len(fetch.keys))
                log.debug("read-ahead of keys %s failed: %s", fetch.keys[:4], e, extra={"event": "read_ahead"})
            finally:
                with self._lock:
                    meanwhile = {key for key in fetch.keys if self._fetched.pop((number, key), 0) == READ_MEANWHILE}
                    self._fetched.update(((number, key), n) for key, n in fetched.items() if key not in meanwhile)
                self._used([n for key, n in fetched.items() if key in meanwhile])
                self._slots.release()

        try:
            self._pool.submit(run)
        except RuntimeError:  # shut down meanwhile
            self._slots.release()
            return False
        return True

    def _used(self, fetched: list[int]) -> None:
        """Files fetched ahead and read (fetched: the bytes fetched for each), counted."""
        if fetched:
            self.metrics.read_ahead.labels("used").inc(len(fetched))
            self.metrics.read_ahead_bytes.labels("used").inc(sum(fetched))

    def close(self) -> None:
        """The mount has ended: fetches not begun are dropped, those under way end with their request."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _moved(position: tuple[int, ...], axis: int, by: int) -> tuple[int, ...]:
    return (*position[:axis], position[axis] + by, *position[axis + 1 :])
