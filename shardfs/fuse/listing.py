"""Directory listings as the kernel reads them: a page at a time, from an offset it keeps.

A directory's entries are listed once into a `Listing`: sorted by name, kept compactly in the mount's
byte-bounded cache. A directory offset is an entry's number in it: resuming anywhere is an index, the same
offset names the same entry on every daemon serving the same source (a new daemon lists the directory again
and gets the same order), and an open directory handle holds nothing at all: no thread, no descriptor, no
memory. Listings are made by `ListingWorkers`, a few threads per mount, taking turns between the users
that wait: the session's threads never wait on a listing, so reads go on while directories are listed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger("shardfs")

LISTED_NAMES = 1 << 20  # the most entries a directory lists
LISTED_BYTES = 32 << 20  # the most bytes of names a directory lists
LISTING_SECONDS = 300.0  # the longest a directory's listing may take
WORKERS = 4  # threads per mount that make listings; one user may keep all but one busy
DOTS = (b".", b"..")


@dataclass(frozen=True, slots=True)
class Listing:
    """A directory's entries, sorted by name, packed: names end to end, where each ends, which are
    directories. complete: False where a bound cut it short (said in the log when it was made)."""

    names: bytes
    ends: array  # of 'Q'
    dirs: bytes  # 1 for a directory, 0 for a file
    complete: bool = True

    @classmethod
    def of(cls, entries: Iterable[tuple[str, bool]], where: str, started: float | None = None) -> Listing:
        """The first LISTED_NAMES entries (LISTED_BYTES of names) found within LISTING_SECONDS, sorted; a
        name listed twice (an overlay file over its source) once. A listing cut short is logged once."""
        started = time.monotonic() if started is None else started
        found: list[bytes] = []  # each name with its kind after it, a byte below any a name may hold
        nbytes, complete = 0, True
        for name, is_dir in entries:
            found.append(os.fsencode(name) + (b"\1" if is_dir else b"\0"))
            nbytes += len(found[-1])
            if len(found) >= LISTED_NAMES or nbytes >= LISTED_BYTES or time.monotonic() - started > LISTING_SECONDS:
                complete = False
                log.warning(
                    "%s: a listing shows at most %d entries, %d bytes of names, listed within %.0f s; this one "
                    "stops after %d entries (each name past them is still found by name)", where, LISTED_NAMES,
                    LISTED_BYTES, LISTING_SECONDS, len(found), extra={"event": "listing_bound"},
                )  # fmt: skip
                break
        return cls._packed(found, complete)

    @classmethod
    def _packed(cls, found: list[bytes], complete: bool) -> Listing:
        """found sorted (by name: the kind byte sorts below any byte of a name), each name once, packed."""
        found.sort()
        names, ends, dirs = bytearray(), array("Q"), bytearray()
        last = None
        for item in found:
            name = item[:-1]
            if name == last:
                continue  # listed twice (a name both a file and a directory): a file
            last = name
            names += name
            ends.append(len(names))
            dirs.append(item[-1])
        return cls(bytes(names), ends, bytes(dirs), complete)

    @property
    def nbytes(self) -> int:
        return len(self.names) + 9 * len(self.dirs)

    def __len__(self) -> int:
        """Entries, "." and ".." included."""
        return len(self.dirs) + len(DOTS)

    def entry(self, offset: int) -> tuple[bytes, bool]:
        """(name, is_dir) of the entry at offset: "." and ".." first, then the names in order."""
        if offset < len(DOTS):
            return DOTS[offset], True
        i = offset - len(DOTS)
        return self.names[self.ends[i - 1] if i else 0 : self.ends[i]], bool(self.dirs[i])


class ListingWorkers:
    """A few threads that make listings, started at the first one asked for. Each user's requests wait in a
    queue of their own; the workers take the users in turn, and no user's requests run on every worker at
    once, so one user listing many large directories cannot keep another's listing waiting behind them all."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._queues: dict[int, deque[Callable[[], None]]] = {}
        self._running: dict[int, int] = {}  # a user's requests being made now
        self._turns: deque[int] = deque()  # users with requests waiting, in the order they take turns
        self._wake = threading.Condition()
        self._started = 0

    def submit(self, uid: int, job: Callable[[], None]) -> None:
        """Run job in a worker, in uid's turn."""
        with self._wake:
            queue = self._queues.setdefault(uid, deque())
            if not queue:
                self._turns.append(uid)
            queue.append(job)
            if self._started < self.workers:
                self._started += 1
                threading.Thread(target=self._work, name=f"shardfs-listing-{self._started}", daemon=True).start()
            self._wake.notify()

    def _next(self) -> tuple[int, Callable[[], None]]:
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
