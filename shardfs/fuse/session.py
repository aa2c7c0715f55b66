"""A FUSE session over /dev/fuse: threads read requests and answer them, by opcode.

Every thread reads the device and answers what it read (see `Session._loop`); `os.readv` releases the GIL
while it waits, and requests that wait on the store are answered in parallel. INIT grants what lets a
read-only tree be served fast: lookups in one directory in parallel (PARALLEL_DIROPS), reads of up to
1 MiB (MAX_PAGES), readahead in parallel (ASYNC_READ), and no OPEN at all where the kernel can do without
(OPEN answered ENOSYS: it then keeps a file's pages across opens, so a warm read never leaves the kernel).
Node ids name paths while the kernel holds them: a chunk file's id is its name packed into 64 bits; the rest
are counted in a table (a lookup counts one more, FORGET counts them down, and a node is dropped at zero).
Unmounting makes every read fail with ENODEV: each thread then ends.

A session given a connection's record (fuse/record.py) outlives its daemon: INIT's terms and the table are
written there, and a session started on a kept descriptor restores both instead of waiting for INIT, then
asks the kernel to resend what the daemon before read and never answered (FUSE_NOTIFY_RESEND).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shardfs import logs
from shardfs.fuse import wire
from shardfs.fuse.adapter import BLOCK_SIZE, NAME_MAX, FuseError, TreeOps, attr, count
from shardfs.fuse.record import Record, Terms
from shardfs.fuse.wire import InitFlag, InitFlag2, Op

log = logging.getLogger("shardfs")

BUFFER = 64 * 1024  # a request never needs more: no writes, names up to 255 bytes, forgets batched to fit
MAX_WRITE = 4096  # the least the kernel accepts; nothing is written to a read-only tree
MAX_PAGES = 256  # reads of up to 1 MiB in one request
KERNEL_BACKGROUND = 12  # the kernel's default of asynchronous requests (readahead) in flight: never fewer
WANTED = InitFlag.ASYNC_READ | InitFlag.PARALLEL_DIROPS | InitFlag.MAX_PAGES
ZERO_ATTR = bytes(wire.ATTR.size)
READDIR_MOST = 32 << 10  # bytes of entries a READDIR answers: glibc asks st_blksize (1 MiB) after each seek
STATFS_UNIT = 512  # f_frsize: `df` shows the source's size to within half a KiB
# Opcodes answered ENOSYS: the kernel remembers most (FLUSH, FSYNC, xattrs, ACCESS, LSEEK, POLL, BMAP)
# and never asks again; locks are then kept by the kernel alone.
NOT_IMPLEMENTED = frozenset(
    {
        Op.FLUSH, Op.FSYNC, Op.FSYNCDIR, Op.GETXATTR, Op.LISTXATTR, Op.ACCESS, Op.GETLK, Op.SETLK, Op.SETLKW,
        Op.BMAP, Op.POLL, Op.LSEEK, Op.SYNCFS, Op.SETUPMAPPING, Op.REMOVEMAPPING,
    }
)  # fmt: skip
OPCODE_UNIQUE = struct.Struct("=IQ")  # fuse_in_header's opcode and unique, from its 4th byte
IOCTL = int(Op.IOCTL)
UNANSWERED = frozenset({Op.FORGET, Op.BATCH_FORGET, Op.INTERRUPT, Op.NOTIFY_REPLY})  # the kernel waits on none
# With `allow_root`, what any user's request may still do, as libfuse had it: the kernel's own housekeeping,
# and what follows an OPEN or OPENDIR that was checked.
ANY_USER = UNANSWERED | {
    Op.INIT, Op.DESTROY, Op.READ, Op.WRITE, Op.FSYNC, Op.RELEASE, Op.READDIR, Op.READDIRPLUS, Op.FSYNCDIR,
    Op.RELEASEDIR,
}  # fmt: skip
PACKED = 1 << 63  # set in the node id of a numbered path (see Nodes); never in a table's
# A table id restored from a record: the kernel's count of its lookups is the daemon before's, unknown here,
# so it is never counted down to nothing (the table keeps it; directories are few).
UNKNOWN_COUNT = 1 << 62


@dataclass(frozen=True)
class Timeouts:
    """How long the kernel may keep what it was told, in seconds: names, attributes, absences."""

    entry: float = 86400.0
    attr: float = 86400.0
    negative: float = 86400.0


def _split(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


class Keys(Protocol):
    """Paths that are numbers: a provider's directory numbered, and a key below it (`Tree.key_of`)."""

    numbered: list[str]  # the provider directories, by number

    def key_of(self, path: str) -> tuple[int, int] | None: ...

    def path_of(self, number: int, key: int) -> str | None: ...


class Nodes:
    """Node ids of the paths the kernel holds. A path a provider numbers (a chunk file) has for id its name:
    PACKED, then its directory's number, then its key. Nothing is kept for it, FORGET of it has nothing to
    do, and the same path has the same id (and so `st_ino`) on every mount of the same metadata: memory
    grows with directories, not with the files the kernel has seen. Every other path (directories, metadata,
    files passed through, a key too large to pack) gets an id from a table, with the kernel's lookup count
    of it, and is dropped at zero. Table ids are never reused, so a stale id from the kernel is an error,
    not another file. With a record, the table is journalled there, and restored from it at start: the
    kernel may hold table ids across a restart of the daemon."""

    def __init__(self, keys: Keys, record: Record | None = None) -> None:
        self._keys = keys
        self._record = record
        self._shift = 63 - max(len(keys.numbered) - 1, 0).bit_length()  # bits of the key, below the number's
        self._paths: dict[int, str] = {wire.ROOT_ID: ""}
        self._ids: dict[str, int] = {"": wire.ROOT_ID}
        self._counts: dict[int, int] = {}
        self._next = wire.ROOT_ID + 1
        self._lock = threading.Lock()
        self._last = (0, "")  # the last numbered path looked up: a read mostly follows its file's lookup
        if record is not None:
            for nodeid, path in record.table().items():
                self._paths[nodeid], self._ids[path], self._counts[nodeid] = path, nodeid, UNKNOWN_COUNT
            self._next = max(self._next, record.highest + 1)

    def __len__(self) -> int:
        """Paths in the table."""
        return len(self._paths)

    def path(self, nodeid: int) -> str:
        """The path of a node the kernel holds; KeyError if it holds no such node."""
        if nodeid & PACKED:
            last = self._last
            if last[0] == nodeid:
                return last[1]
            path = self._keys.path_of((nodeid ^ PACKED) >> self._shift, nodeid & ((1 << self._shift) - 1))
            if path is None:
                raise KeyError(nodeid)
            return path
        return self._paths[nodeid]

    def _packed(self, path: str) -> int | None:
        """The node id that is path's name, or None if path is not numbered or its key does not fit."""
        found = self._keys.key_of(path)
        return None if found is None or found[1] >> self._shift else PACKED | found[0] << self._shift | found[1]

    def ino(self, path: str) -> int:
        """The inode number a listing shows for path (`find -inum` and `-printf %i` take it): its node id
        where that needs no lookup counted (a numbered path, or one the table holds), else unknown."""
        packed = self._packed(path)
        return self._ids.get(path, wire.UNKNOWN_INO) if packed is None else packed

    def looked_up(self, path: str) -> int:
        """The id of path, counted once more if it is in the table."""
        nodeid = self._packed(path)
        if nodeid is not None:
            self._last = (nodeid, path)
            return nodeid
        with self._lock:
            nodeid = self._ids.get(path)
            if nodeid is None:
                nodeid = self._next
                self._next += 1
                self._ids[path] = nodeid
                self._paths[nodeid] = path
                if self._record is not None:
                    self._record.added(nodeid, path)
            if nodeid != wire.ROOT_ID:
                self._counts[nodeid] = self._counts.get(nodeid, 0) + 1
            return nodeid

    def forget(self, nodeid: int, times: int) -> None:
        """The kernel let go of nodeid times lookups; at none left a table id is dropped."""
        if nodeid & PACKED:
            return
        with self._lock:
            left = self._counts.get(nodeid, 0) - times
            if left > 0:
                self._counts[nodeid] = left
            elif nodeid in self._counts:
                del self._counts[nodeid]
                path = self._paths.pop(nodeid)
                del self._ids[path]
                if self._record is not None:
                    self._record.dropped(nodeid, path, self._paths)


class Session:
    """Serves ops on an open /dev/fuse fd until the filesystem is unmounted. on_ready runs once INIT
    is answered: the mount then answers requests (`granted_text` says on what terms). owner (`allow_root`):
    only that user's and root's requests are served, others answered EACCES, and every open is asked for
    (no no_open) so that a page cached for root is not read by another user. debug: every request and
    answer logged at DEBUG. record: where INIT's terms and the node table are kept for the next daemon.
    kept: fd is a connection a daemon before served (its record given): INIT's terms are restored, not
    waited for, and what that daemon read and never answered is asked for again."""

    def __init__(
        self, fd: int, ops: TreeOps, threads: int = 10, timeouts: Timeouts | None = None,
        kernel_cache: bool = True, on_ready: Callable[[], None] | None = None, owner: int | None = None,
        debug: bool = False, record: Record | None = None, kept: bool = False,
    ) -> None:  # fmt: skip
        self.fd = fd
        self.owner = owner
        self.debug = debug
        self.ops = ops
        self.threads = threads
        self.record = record
        self.kept = kept
        self.nodes = Nodes(ops.tree, record)
        self.kernel_cache = kernel_cache
        self.on_ready = on_ready
        self.no_open = False  # until INIT says whether the kernel takes ENOSYS for OPEN as "none needed"
        self.granted = InitFlag(0)
        self.interrupts = 0  # INTERRUPTs received, for tests and stats
        self.resend = False  # whether the kernel offered FUSE_HAS_RESEND
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._running = 0
        self.minor = 0
        timeouts = timeouts or Timeouts()
        self._entry_valid = (*_split(timeouts.entry), *_split(timeouts.attr))
        self._attr_valid = _split(timeouts.attr)
        self._negative = _split(timeouts.negative) if timeouts.negative > 0 else None
        self._handlers: dict[int, Callable[[int, int, memoryview], None]] = {
            Op.INIT: self._init, Op.LOOKUP: self._lookup, Op.FORGET: self._forget,
            Op.BATCH_FORGET: self._batch_forget, Op.GETATTR: self._getattr, Op.OPEN: self._open,
            Op.READ: self._read, Op.RELEASE: self._ok, Op.OPENDIR: self._opendir, Op.READDIR: self._readdir,
            Op.RELEASEDIR: self._releasedir, Op.STATFS: self._statfs,
            Op.READLINK: self._not_a_link, Op.INTERRUPT: self._interrupt, Op.NOTIFY_REPLY: self._ignore,
            Op.DESTROY: self._ok,
        }  # fmt: skip

    def run(self) -> None:
        """Serve until unmounted (returns once every thread has ended) or stopped."""
        terms = self.record.terms() if self.kept and self.record is not None else None
        if terms is not None:
            self._restore(terms)
        elif self.kept:  # the daemon before died before answering INIT: if it had read it, it comes again
            self._resend(quiet=True)
        self._running = self.threads
        for i in range(self.threads):
            threading.Thread(target=self._serve, name=f"fuse-{i}", daemon=True).start()
        if terms is not None and self.on_ready is not None:
            self.on_ready()
        self._done.wait()

    def _restore(self, terms: Terms) -> None:
        """Take up a kept connection on the terms its INIT settled; have the kernel resend what was read and
        never answered, if it can (Linux 6.9 and later: FUSE_HAS_RESEND offered). A kernel that cannot
        keeps those requests waiting for an answer that never comes, uninterruptibly: their callers hang
        until the connection ends."""
        self.minor = terms.minor
        self.granted = InitFlag(terms.granted & 0xFFFFFFFF)
        self.no_open = terms.no_open
        self.resend = terms.resend
        if terms.resend:
            self._resend()
        else:
            log.warning(
                "this kernel cannot resend requests (FUSE_HAS_RESEND, Linux 6.9): those the daemon before read"
                " and never answered hang until the mount ends", extra={"event": "no_resend"},
            )  # fmt: skip

    def _resend(self, quiet: bool = False) -> None:
        """FUSE_NOTIFY_RESEND: every request read and not answered goes back in the queue. quiet: a kernel
        that does not know it (EINVAL) is not worth a word."""
        try:
            os.write(self.fd, wire.OUT_HEADER.pack(wire.OUT_HEADER.size, wire.Notify.RESEND, 0))
        except OSError as e:
            if not quiet:
                log.error("could not ask the kernel to resend requests: %s", e, extra={"event": "no_resend"})

    @property
    def ended(self) -> bool:
        """Whether every thread has ended (the filesystem was unmounted)."""
        return not self._running

    def stop(self) -> None:
        """Make run return now; the threads end with the process (or once the mount goes)."""
        self._done.set()

    def _serve(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    self._done.set()

    def _loop(self) -> None:
        """Every thread reads the device and answers what it read, as libfuse's workers do: the kernel hands
        each request to one waiting reader, and a request that waits (on the store, the network) holds only
        its own thread. (Handing the reading on to another thread for every request that might wait cost
        a cold file 38 µs of CPU more, each hand-off a wake-up and a fight for the GIL: scripts/cold_cpu.py,
        one reader, 9,800 against 6,300 files/s.) The IOCTL that Python's `open()` sends for its isatty
        check, never kept by the kernel, is answered before any dispatch: a warm `open()` costs the daemon
        30% less CPU."""
        buffer = bytearray(BUFFER)
        view = memoryview(buffer)
        while size := self._next(buffer):
            opcode, unique = OPCODE_UNIQUE.unpack_from(buffer, 4)
            if opcode == IOCTL:  # Python's open() asks if the file is a terminal (TCGETS): none is
                self._error(unique, errno.ENOTTY, counted=False)
            else:
                self._dispatch(view[:size])

    def _next(self, buffer: bytearray) -> int:
        """The next request's size; 0 once the filesystem is unmounted (or, in tests, the socket closed)."""
        while True:
            try:
                return os.readv(self.fd, [buffer])
            except OSError as e:
                if e.errno == errno.ENODEV:  # unmounted
                    return 0
                if e.errno not in (errno.ENOENT, errno.EINTR, errno.EAGAIN):  # ENOENT: interrupted before read
                    raise

    def _dispatch(self, request: memoryview) -> None:
        _, opcode, unique, nodeid, uid, _, pid, *_ = wire.IN_HEADER.unpack_from(request)
        if unique & wire.UNIQUE_RESEND:
            self.ops.metrics.resent.inc()
        body = request[wire.IN_HEADER.size :]
        handler = self._handlers.get(opcode)
        logs.serving(uid)
        if self.debug:
            log.debug(
                "request %d: %s node %d, uid %d, pid %d, %d bytes", unique, _name(opcode), nodeid, uid, pid,
                len(request), extra={"event": "fuse_request"},
            )  # fmt: skip
        try:
            if self.owner is not None and uid not in (0, self.owner) and opcode not in ANY_USER:
                self._error(unique, errno.EACCES, counted=False)
            elif handler is not None:
                handler(unique, nodeid, body)
            elif opcode in wire.READ_ONLY_REFUSED:
                self._error(unique, errno.EROFS)
            else:
                self._error(unique, errno.ENOSYS, counted=opcode not in NOT_IMPLEMENTED)
        except FuseError as e:
            self._error(unique, e.errno, counted=False)  # counted where it was raised
        except KeyError:  # a node id we do not hold
            log.error("request %s for unknown node %d", _name(opcode), nodeid, extra={"event": "bug"})
            self._error(unique, errno.ESTALE)
        except Exception:
            log.exception("%s failed", _name(opcode), extra={"event": "bug"})
            if opcode not in UNANSWERED:
                self._error(unique, errno.EIO)

    # Replies. A reply to a request the kernel has dropped meanwhile (interrupted: ENOENT) or to an
    # unmounted filesystem (ENODEV) goes nowhere, as it should.
    def _reply(self, unique: int, *parts: bytes) -> None:
        size = wire.OUT_HEADER.size + sum(map(len, parts))
        if self.debug:
            log.debug("answer %d: %d bytes", unique, size, extra={"event": "fuse_answer"})
        try:
            os.writev(self.fd, [wire.OUT_HEADER.pack(size, 0, unique), *parts])
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def _error(self, unique: int, code: int, counted: bool = True) -> None:
        if counted:
            count(self.ops.metrics, code)
        if self.debug:
            log.debug("answer %d: %s", unique, errno.errorcode.get(code, code), extra={"event": "fuse_answer"})
        try:
            os.write(self.fd, wire.OUT_HEADER.pack(wire.OUT_HEADER.size, -code, unique))
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    # Requests
    def _init(self, unique: int, nodeid: int, body: memoryview) -> None:
        major, minor, max_readahead, flags = wire.INIT_IN.unpack_from(body)
        if major > wire.KERNEL_MAJOR:  # a newer kernel asks again, in our major
            self._reply(unique, wire.INIT_OUT.pack(wire.KERNEL_MAJOR, wire.OUR_MINOR, *(0,) * 9))
            return
        minor = min(minor, wire.OUR_MINOR)
        if major < wire.KERNEL_MAJOR or minor < wire.MIN_MINOR:
            log.error("kernel FUSE protocol %d.%d is too old (7.%d at least)", major, minor, wire.MIN_MINOR)
            self._error(unique, errno.EPROTO)
            return
        offered = InitFlag(flags)
        offered2 = 0
        if InitFlag.INIT_EXT in offered and len(body) >= wire.INIT_IN.size + wire.INIT_IN_FLAGS2.size:
            (offered2,) = wire.INIT_IN_FLAGS2.unpack_from(body, wire.INIT_IN.size)
        self.granted = WANTED & offered
        self.no_open = InitFlag.NO_OPEN_SUPPORT in offered and self.owner is None
        self.resend = InitFlag2.HAS_RESEND in InitFlag2(offered2)
        self.minor = minor
        background = min(max(self.threads, KERNEL_BACKGROUND), 0xFFFF)
        if self.record is not None:  # before the answer: a connection kept from here on has its terms
            terms = Terms(minor, int(self.granted), max_readahead, MAX_WRITE, MAX_PAGES, 1, self.no_open, self.resend)
            self.record.settle(terms)
        reply = wire.INIT_OUT.pack(
            wire.KERNEL_MAJOR, minor, max_readahead, self.granted, background, background * 3 // 4,
            MAX_WRITE, 1, MAX_PAGES, 0, 0,
        )  # fmt: skip
        self._reply(unique, reply if minor >= 23 else reply[: wire.COMPAT_22_INIT_OUT_SIZE])
        if self.on_ready is not None:
            self.on_ready()

    def granted_text(self) -> str:
        """What INIT settled, for the mount's log line: `FUSE 7.38, granted ASYNC_READ|..., no_open, 10 threads`."""
        granted = "|".join(flag.name or "" for flag in InitFlag if flag in self.granted) or "nothing"
        kept = ", a kept connection taken up" if self.kept else ""
        no_open = ", no_open" if self.no_open else ""
        return f"FUSE 7.{self.minor}, granted {granted}{no_open}, {self.threads} threads{kept}"

    def _child(self, nodeid: int, body: memoryview) -> str:
        parent = self.nodes.path(nodeid)
        name = os.fsdecode(bytes(body[: len(body) - 1]))  # NUL-terminated
        return f"{parent}/{name}" if parent else name

    def _lookup(self, unique: int, nodeid: int, body: memoryview) -> None:
        path = self._child(nodeid, body)
        # A name longer than NAME_MAX (the kernel passes up to 1,024 bytes) is absent without asking the source,
        # which would answer ENAMETOOLONG: any user could fill the log with that, and no dataset has one.
        fields = None if len(body) - 1 > NAME_MAX else self.ops.attributes(path)
        if fields is None:
            if self._negative is None:
                self._error(unique, errno.ENOENT, counted=False)
            else:  # node id 0: the kernel keeps the absence for the negative timeout
                entry = wire.ENTRY_OUT.pack(0, 0, self._negative[0], 0, self._negative[1], 0)
                self._reply(unique, entry, ZERO_ATTR)
            return
        child = self.nodes.looked_up(path)
        entry_s, entry_ns, attr_s, attr_ns = self._entry_valid
        self._reply(unique, wire.ENTRY_OUT.pack(child, 0, entry_s, attr_s, entry_ns, attr_ns), attr(child, fields))

    def _forget(self, unique: int, nodeid: int, body: memoryview) -> None:
        self.nodes.forget(nodeid, wire.FORGET_IN.unpack_from(body)[0])

    def _batch_forget(self, unique: int, nodeid: int, body: memoryview) -> None:
        (number, _) = wire.BATCH_FORGET_IN.unpack_from(body)
        for i in range(number):
            self.nodes.forget(*wire.FORGET_ONE.unpack_from(body, wire.BATCH_FORGET_IN.size + i * wire.FORGET_ONE.size))

    def _getattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        fields = self.ops.attributes(self.nodes.path(nodeid))
        if fields is None:
            raise FuseError(errno.ENOENT)
        self._reply(unique, wire.ATTR_OUT.pack(*self._attr_valid, 0), attr(nodeid, fields))

    def _open(self, unique: int, nodeid: int, body: memoryview) -> None:
        """ENOSYS tells a kernel that can do without it not to ask again (FUSE no_open): it then sends
        neither OPEN nor RELEASE and keeps a file's pages across opens. Permissions are the kernel's
        (`default_permissions`); writes are refused by the `ro` mount."""
        self.ops.metrics.ops.labels("open").observe(0)  # so that `shardfs stats` shows whether the kernel still asks
        if self.no_open:
            self._error(unique, errno.ENOSYS, counted=False)
        else:
            self._reply(unique, wire.OPEN_OUT.pack(0, wire.FOPEN_KEEP_CACHE if self.kernel_cache else 0, 0))

    def _read(self, unique: int, nodeid: int, body: memoryview) -> None:
        _, offset, size, *_ = wire.READ_IN.unpack_from(body)
        self._reply(unique, self.ops.read(self.nodes.path(nodeid), offset, size))

    def _opendir(self, unique: int, nodeid: int, body: memoryview) -> None:
        """Handle 0: a directory handle carries nothing (see `_readdir`)."""
        self.ops.opendir(self.nodes.path(nodeid))
        self._reply(unique, wire.OPEN_OUT.pack(0, 0, 0))

    def _readdir(self, unique: int, nodeid: int, body: memoryview) -> None:
        """Answered at once from a listing already made; else a listing worker makes it and answers, in the
        turn of the user who asked, and this thread goes back to reading requests."""
        _, offset, size, *_ = wire.READ_IN.unpack_from(body)
        directory = self.nodes.path(nodeid)
        if self.ops.listed(directory) is not None:
            self._dirents(unique, directory, offset, size)
            return
        uid = wire.IN_HEADER.unpack_from(body.obj)[4]  # type: ignore[arg-type]  # the header before body
        self.ops.listings.submit(uid, lambda: self._dirents(unique, directory, offset, size))

    def _dirents(self, unique: int, directory: str, offset: int, size: int) -> None:
        """The entries of directory from offset that fit in size bytes, or the error the listing met."""
        try:
            listing = self.ops.listing(
                directory, lambda name: self.nodes.ino(f"{directory}/{name}" if directory else name)
            )
        except FuseError as e:
            self._error(unique, e.errno, counted=False)  # counted where it was raised
            return
        self._reply(unique, listing.page(offset, min(size, READDIR_MOST)))

    def _releasedir(self, unique: int, nodeid: int, body: memoryview) -> None:
        """Nothing to let go of: a directory handle carries nothing."""
        self._reply(unique)

    def _statfs(self, unique: int, nodeid: int, body: memoryview) -> None:
        """The source's stored bytes as size and used, nothing free (read-only), in 512-byte units."""
        nbytes, files = self.ops.stored.now()
        blocks = -(-nbytes // STATFS_UNIT)
        self._reply(unique, wire.STATFS_OUT.pack(blocks, 0, 0, files, 0, BLOCK_SIZE, NAME_MAX, STATFS_UNIT, 0))

    def _not_a_link(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._error(unique, errno.EINVAL)

    def _ok(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._reply(unique)

    def _interrupt(self, unique: int, nodeid: int, body: memoryview) -> None:
        """The request it names is answered when it is done, as if never interrupted: the kernel takes
        that answer (or drops it, if its caller is gone)."""
        self.interrupts += 1

    def _ignore(self, unique: int, nodeid: int, body: memoryview) -> None:
        """NOTIFY_REPLY: nothing is ever asked of the kernel, so nothing is expected back."""


def _name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return str(opcode)
