"""Directory listings as the kernel reads them: a page at a time, from an offset it keeps.

A directory's entries are listed once into a `Listing`: sorted by name, kept compactly in the mount's
byte-bounded cache. A directory offset is an entry's number in it: resuming anywhere is an index, the same
offset names the same entry on every daemon serving the same source (a new daemon lists the directory again
and gets the same order), and an open directory handle holds nothing at all: no thread, no descriptor, no
memory. Listings are made by `ListingWorkers`, a few threads per mount, taking turns between the users
that wait: the session's threads never wait on a listing, so reads go on while directories are listed.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import os
import stat
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from shardfs import logs
from shardfs.fuse import wire

log = logging.getLogger("shardfs")

LISTED_NAMES = 1 << 20  # the most entries a directory lists
LISTED_BYTES = 32 << 20  # the most bytes of names a directory lists
LISTING_SECONDS = 300.0  # the longest a directory's listing may take
WORKERS = 4  # threads per mount that make listings; one user may keep all but one busy
RUN = 1 << 14  # names sorted at a time while a listing is made (as objects: about 1 MiB)
DOTS = 2  # "." and "..", first in every listing
DT_DIR, DT_REG = stat.S_IFDIR >> 12, stat.S_IFREG >> 12


@dataclass(frozen=True, slots=True)
class Listing:
    """A directory's entries, sorted by name, as the kernel reads them: fuse_dirent records end to end ("."
    and ".." first; each one's d_off the number of the next), and where each starts. A page from any offset
    is then one slice, whatever the directory's size, and costs the daemon no work per entry. complete:
    False where a bound cut it short (said in the log when it was made)."""

    dirents: bytearray  # never changed once made
    starts: array  # of 'I': where each entry starts in dirents, and where the last ends (dirents stay well
    # below 4 GiB: LISTED_NAMES entries of 32 bytes and LISTED_BYTES of names)
    complete: bool = True

    @classmethod
    def of(cls, entries: Iterable[tuple[str, bool]], where: str, ino: Callable[[str], int]) -> Listing:
        """The first LISTED_NAMES entries (LISTED_BYTES of names) found within LISTING_SECONDS, sorted, each
        name once; ino: the inode number an entry shows, by name. A listing cut short is logged once."""
        names = _SortedRuns()
        until, complete = time.monotonic() + LISTING_SECONDS, True
        for name, is_dir in entries:
            if name in (".", ".."):  # every listing's own two, whatever a server names
                continue
            encoded = os.fsencode(name)
            if len(names) >= LISTED_NAMES or names.nbytes + len(encoded) > LISTED_BYTES or time.monotonic() > until:
                complete = False
                log.warning(
                    "%s: a listing shows at most %d entries, %d bytes of names, listed within %.0f s; this one "
                    "stops after %d entries (each name past them is still found by name)", where, LISTED_NAMES,
                    LISTED_BYTES, LISTING_SECONDS, len(names), extra={"event": "listing_bound"},
                )  # fmt: skip
                break
            names.add(encoded, is_dir)
        dirents, starts = bytearray(), array("I")
        last = None
        for item in itertools.chain((b".\1", b"..\1"), names.merged()):
            name = item[:-1]
            if name == last:
                continue  # listed twice (a name both a file and a directory): a file, which sorts first
            last = name
            starts.append(len(dirents))
            number = ino(os.fsdecode(name)) if len(starts) > DOTS else wire.UNKNOWN_INO
            dirents += wire.dirent(number, len(starts), name, DT_DIR if item[-1] else DT_REG)
        starts.append(len(dirents))
        return cls(dirents, starts, complete)

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.dirents) + sys.getsizeof(self.starts)  # as allocated: a grown buffer has room spare

    def __len__(self) -> int:
        """Entries, "." and ".." included."""
        return len(self.starts) - 1

    def page(self, offset: int, size: int) -> bytes:
        """The entries from offset on that fit in size bytes, packed."""
        if not 0 <= offset < len(self):
            return b""
        start = self.starts[offset]
        stop = self.starts[bisect.bisect_right(self.starts, start + size, offset) - 1]
        return bytes(memoryview(self.dirents)[start:stop])

    def position(self, name: bytes) -> int | None:
        """The offset of the entry called name, found by bisection (the entries are sorted), or None."""
        low, high = DOTS, len(self)
        while low < high:
            middle = (low + high) // 2
            if self.entry(middle)[0] < name:
                low = middle + 1
            else:
                high = middle
        return low if low < len(self) and self.entry(low)[0] == name else None

    def entry(self, offset: int) -> tuple[bytes, bool]:
        """(name, is_dir) of the entry at offset."""
        at = self.starts[offset]
        _, _, namelen, file_type = wire.DIRENT.unpack_from(self.dirents, at)
        at += wire.DIRENT.size
        return bytes(memoryview(self.dirents)[at : at + namelen]), file_type == DT_DIR


class ListingWorkers:
    """A few threads that make listings, started at the first one asked for. Each user's requests wait in a
    queue of their own; the workers take the users in turn, and no user's requests run on every worker at
    once, so one user listing many large directories cannot keep another's listing waiting behind them all."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._queues: dict[int | None, deque[Callable[[], None]]] = {}
        self._running: dict[int | None, int] = {}  # a user's requests being made now
        self._turns: deque[int | None] = deque()  # users with requests waiting, in the order they take turns
        self._wake = threading.Condition()
        self._started = 0

    def submit(self, uid: int | None, job: Callable[[], None]) -> None:
        """Run job in a worker, in uid's turn."""
        with self._wake:
            queue = self._queues.setdefault(uid, deque())
            if not queue:
                self._turns.append(uid)
            queue.append(job)
            if self._started < self.workers:
                self._started += 1
                logs.start_thread(self._work, f"shardfs-listing-{self._started}")  # the session's mount's
            self._wake.notify()

    def _next(self) -> tuple[int | None, Callable[[], None]]:
        """The next job, of the first user in turn who may take another worker; waits until there is one."""
        with self._wake:
            while True:
                for _ in range(len(self._turns)):
                    uid = self._turns.popleft()
                    if self._running.get(uid, 0) < max(self.workers - 1, 1):
                        queue = self._queues[uid]
                        job = queue.popleft()
                        if queue:
                            self._turns.append(uid)
                        else:
                            del self._queues[uid]
                        self._running[uid] = self._running.get(uid, 0) + 1
                        return uid, job
                    self._turns.append(uid)
                self._wake.wait()

    def _work(self) -> None:
        while True:
            uid, job = self._next()
            try:
                job()
            except Exception:  # a job answers its own errors: this one is a bug, and the worker goes on
                log.exception("a listing failed", extra={"event": "bug"})
            finally:
                with self._wake:
                    self._running[uid] -= 1
                    if not self._running[uid]:
                        del self._running[uid]
                    self._wake.notify_all()


class _SortedRuns:
    """Names gathered for a listing, held packed: RUN names at a time are sorted as objects, then appended end
    to end to one buffer, with where each ends, so a directory's names cost their bytes and 4 more each while
    it is listed, not a Python object each (some 60 bytes, which the allocator keeps once they are freed among
    objects that live on), and the buffer is given back whole. `merged` gives them back in order, one at a time."""

    def __init__(self) -> None:
        self._packed = bytearray()
        self._ends = array("I", [0])  # where each name starts and ends: names are at most LISTED_BYTES
        self._runs = [0]  # where each sorted run starts and ends, in names
        self._batch: list[bytes] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._ends) - 1 + len(self._batch)

    def add(self, name: bytes, is_dir: bool) -> None:
        self._batch.append(name + (b"\1" if is_dir else b"\0"))  # sorted with its type, a file first
        self.nbytes += len(name)
        if len(self._batch) >= RUN:
            self._pack()

    def _pack(self) -> None:
        self._batch.sort()
        ends = itertools.accumulate(map(len, self._batch), initial=len(self._packed))
        next(ends)  # where the last run ended, there already
        self._ends.extend(ends)
        self._packed += b"".join(self._batch)
        self._runs.append(len(self._ends) - 1)
        self._batch = []

    def merged(self) -> Iterator[bytes]:
        """Every name, sorted (duplicates kept)."""
        if self._batch:
            self._pack()
        return heapq.merge(*(self._run(start, stop) for start, stop in itertools.pairwise(self._runs)))

    def _run(self, start: int, stop: int) -> Iterator[bytes]:
        packed = memoryview(self._packed)
        for begin, end in itertools.pairwise(self._ends[start : stop + 1]):
            yield packed[begin:end].tobytes()
