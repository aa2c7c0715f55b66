"""What a FUSE connection's next daemon must know, kept beside its /dev/fuse descriptor: a memfd.

INIT happens once per connection, so a daemon that adopts a kept descriptor restores what was negotiated
(`Terms`) instead of waiting for an INIT that never comes. And the kernel goes on holding node ids across
the restart: a chunk file's id names its key (fs/nodes.py), but a table id (a directory, metadata,
a file passed through) means only what the table said, so the table is journalled here as it changes and
rebuilt from the journal by the next daemon. So are the numbers of directories a directory of datasets gives
as it is browsed (collection.py): a chunk file's id names its directory by that number.

What the connection serves (the source, view and mountpoint, as text its daemon chose) is stamped at
SERVES_AT: a daemon asked to serve something else must not take the connection up, or names the kernel
cached would read another dataset's bytes.

Layout (native byte order): a header at 0 (magic, the journal's start and end, the length of the terms, the length
of what it serves: 0 in a record made before that was stamped, read as unknown), the terms as JSON at TERMS_AT,
what it serves at SERVES_AT, the journal from JOURNAL_AT: entries of (node id, path length, path), a length of
DROPPED meaning the id was dropped (a rewritten journal begins with the highest id ever journalled, dropped: ids
are never reused), an id of NUMBERS numbering the path, a directory, with the next directory number (no node has
that id: a daemon that knows no numbers takes the entry for a harmless one). Every change writes its bytes first
and then, in one pwrite, the header field that makes them count: a daemon killed at any point leaves a record that
reads as before or as after. Once the journal holds more dropped than live bytes it is rewritten after its end,
the header moved to it in one write, and the old bytes' pages given back (fallocate PUNCH_HOLE).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import stat
import struct
from dataclasses import asdict, dataclass
from typing import Protocol

from shardfs.fuse.mount import FUSE_DEVICE

MAGIC = b"shardfs1"
HEADER = struct.Struct("=8sQQII")  # magic, journal start, journal end, terms length, served length
SPAN = struct.Struct("=QQ")  # journal start and end, written together
SPAN_AT = 8
TERMS_LENGTH_AT = 24
SERVES_LENGTH_AT = 28
TERMS_AT = 64
SERVES_AT = 2048
JOURNAL_AT = 4096
ENTRY = struct.Struct("=QI")  # node id, path length (DROPPED: the id was dropped)
DROPPED = 0xFFFFFFFF
NUMBERS = 0  # the id of an entry that gives its directory the next number, in the order journalled
COMPACT_AFTER = 1 << 20  # journal bytes before dropped entries are worth rewriting away
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class RecordError(Exception):
    """A descriptor handed over as a record is not one."""


@dataclass(frozen=True)
class Terms:
    """What INIT settled: the protocol minor answered, the flags granted (flags2 above bit 32), the sizes
    answered, whether FUSE no_open is in force, and whether the kernel offered FUSE_HAS_RESEND (it then
    takes FUSE_NOTIFY_RESEND)."""

    minor: int
    granted: int
    max_readahead: int
    max_write: int
    max_pages: int
    time_gran: int
    no_open: bool
    resend: bool


class Record:
    """A connection's record on a memfd (see the module's docstring). Not thread-safe: its three writers never
    write at once. The hand-over stamps what it serves before a session starts (service/handover.py), the
    session settles INIT's terms before answering INIT, the kernel's first request (session.py), and only then
    can the node table journal its ids, under its own lock (fs/nodes.py)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        try:
            magic, start, end, _, _ = HEADER.unpack(os.pread(fd, HEADER.size, 0).ljust(HEADER.size, b"\0"))
        except (OSError, struct.error) as e:
            raise RecordError(f"descriptor {fd}: not a shardfs record ({e})") from None
        if magic != MAGIC:
            raise RecordError(f"descriptor {fd}: not a shardfs record (magic {magic!r})")
        if not JOURNAL_AT <= start <= end <= max(os.fstat(fd).st_size, JOURNAL_AT):  # what was written, not a count
            raise RecordError(f"descriptor {fd}: its journal span {start}-{end} is not within the record")
        self._start, self._end = start, end
        self._live = 0  # bytes of entries still live, counted by table()
        self.highest = 0  # the highest id ever journalled, dropped or not (set by table()): never to be reused
        self.numbered: list[str] = []  # the directories numbered, by number (set by table())

    @classmethod
    def new(cls) -> Record:
        """An empty record, on a memfd of its own (close-on-exec)."""
        fd = os.memfd_create("shardfs-record", os.MFD_CLOEXEC)
        os.pwrite(fd, HEADER.pack(MAGIC, JOURNAL_AT, JOURNAL_AT, 0, 0), 0)
        return cls(fd)

    def terms(self) -> Terms | None:
        """What INIT settled, or None if the connection's INIT was never answered."""
        (length,) = struct.unpack("=I", os.pread(self.fd, 4, TERMS_LENGTH_AT))
        if not length:
            return None
        if length > SERVES_AT - TERMS_AT:
            raise RecordError(f"descriptor {self.fd}: its terms are {length} bytes long, past their room")
        try:
            return Terms(**json.loads(os.pread(self.fd, length, TERMS_AT)))
        except (ValueError, TypeError) as e:
            raise RecordError(f"descriptor {self.fd}: its terms do not read ({e})") from None

    def settle(self, terms: Terms) -> None:
        """Record what INIT settled: before INIT is answered, so that no kept connection lacks it."""
        self._put(json.dumps(asdict(terms)).encode(), TERMS_AT, SERVES_AT, TERMS_LENGTH_AT, "terms")

    def stamp(self, serves: str) -> None:
        """Say what the connection serves: before the record is kept anywhere."""
        self._put(serves.encode(), SERVES_AT, JOURNAL_AT, SERVES_LENGTH_AT, "what it serves")

    def serves(self) -> str | None:
        """What the connection serves, as stamped; None if the record predates stamping."""
        (length,) = struct.unpack("=I", os.pread(self.fd, 4, SERVES_LENGTH_AT).ljust(4, b"\0"))  # 0 if made before
        if length > JOURNAL_AT - SERVES_AT:
            raise RecordError(f"descriptor {self.fd}: what it serves is {length} bytes long, past its room")
        return os.pread(self.fd, length, SERVES_AT).decode(errors="replace") if length else None

    def _put(self, data: bytes, at: int, end: int, length_at: int, what: str) -> None:
        """data at at (up to end), then its length: a record read meanwhile has the old or the new."""
        if at + len(data) > end:
            raise RecordError(f"{what} do not fit the record's header")
        os.pwrite(self.fd, data, at)
        os.pwrite(self.fd, struct.pack("=I", len(data)), length_at)

    def table(self) -> dict[int, str]:
        """The node table as journalled: id → path, ids dropped left out (and the directories numbered, kept as
        `numbered`)."""
        data = os.pread(self.fd, self._end - self._start, self._start)
        table: dict[int, str] = {}
        self.numbered = []
        at = 0
        while at + ENTRY.size <= len(data):
            nodeid, length = ENTRY.unpack_from(data, at)
            at += ENTRY.size
            self.highest = max(self.highest, nodeid)
            if length == DROPPED:
                table.pop(nodeid, None)
                continue
            path = os.fsdecode(data[at : at + length])
            at += length
            if nodeid == NUMBERS:
                self.numbered.append(path)
            else:
                table[nodeid] = path
        self._live = sum(ENTRY.size + len(os.fsencode(path)) for path in (*table.values(), *self.numbered))
        return table

    def added(self, nodeid: int, path: str) -> None:
        name = os.fsencode(path)
        self._append(ENTRY.pack(nodeid, len(name)) + name)
        self._live += ENTRY.size + len(name)
        self.highest = max(self.highest, nodeid)

    def number(self, directory: str) -> None:
        """directory has the next number (len(numbered)): journalled before any node id names it."""
        self.added(NUMBERS, directory)
        self.numbered.append(directory)

    def dropped(self, nodeid: int, path: str, live: dict[str, int]) -> None:
        """nodeid (of path) is gone from the table; live is the table as it is now (path → id), for a rewrite."""
        self._append(ENTRY.pack(nodeid, DROPPED))
        self._live -= ENTRY.size + len(os.fsencode(path))
        if self._end - self._start > max(COMPACT_AFTER, 2 * self._live):
            self._rewrite(live)

    def _append(self, entry: bytes) -> None:
        os.pwrite(self.fd, entry, self._end)
        self._end += len(entry)
        os.pwrite(self.fd, SPAN.pack(self._start, self._end), SPAN_AT)

    def _rewrite(self, live: dict[str, int]) -> None:
        parts = [ENTRY.pack(self.highest, DROPPED)]  # keeps the highest id known, so that none is reused
        for directory in self.numbered:
            name = os.fsencode(directory)
            parts += [ENTRY.pack(NUMBERS, len(name)), name]
        for path, nodeid in live.items():
            if not path:  # the root: its id is fixed, never journalled
                continue
            name = os.fsencode(path)
            parts += [ENTRY.pack(nodeid, len(name)), name]
        data = b"".join(parts)
        old_start, start = self._start, self._end
        os.pwrite(self.fd, data, start)
        self._start, self._end = start, start + len(data)
        os.pwrite(self.fd, SPAN.pack(self._start, self._end), SPAN_AT)
        self._live = len(data)
        # The old journal's whole pages go back to the system; the file's size (offsets) stays.
        first = -(-old_start // JOURNAL_AT) * JOURNAL_AT
        last = start // JOURNAL_AT * JOURNAL_AT
        if last > first:
            _libc.fallocate(self.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ctypes.c_long(first),
                            ctypes.c_long(last - first))  # fmt: skip


@dataclass(frozen=True)
class Connection:
    """A FUSE connection as it passes between daemons (kept by a `Carrier`, taken up by the next daemon): its
    /dev/fuse descriptor and its record."""

    fd: int
    record: Record

    @classmethod
    def of(cls, fds: list[int]) -> Connection:
        """The connection handed over as [/dev/fuse, record] (both made close-on-exec); RecordError if the
        descriptors are not that."""
        if len(fds) != 2:
            raise RecordError(f"a kept connection is 2 descriptors (/dev/fuse, its record), not {len(fds)}")
        st = os.fstat(fds[0])
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != FUSE_DEVICE:
            raise RecordError(f"descriptor {fds[0]}: not /dev/fuse")
        for fd in fds:
            os.set_inheritable(fd, False)
        return cls(fds[0], Record(fds[1]))

    @property
    def fds(self) -> list[int]:
        return [self.fd, self.record.fd]


class Carrier(Protocol):
    """Where a connection waits between daemons: systemd's file-descriptor store, a keeper."""

    def keep(self, connection: Connection) -> None: ...

    def forget(self) -> None:
        """Let go of the connection kept: the mount is ending for good (a stop)."""
        ...

    def restarting(self) -> bool:
        """Whether the SIGTERM just come is the stop half of a restart, which keeps the mount for the next daemon."""
        ...

    def descriptors(self) -> list[int]:
        """What the daemon must hold open to reach it (when it closes what else it inherited)."""
        ...
