"""A FUSE session over /dev/fuse: threads read requests and answer them, by opcode.

Every thread reads the device and answers what it read (see `Session._loop`); `os.readv` releases the GIL
while it waits, and requests that wait on the store are answered in parallel. INIT grants what lets a
read-only tree be served fast: lookups in one directory in parallel (PARALLEL_DIROPS), reads of up to
1 MiB (MAX_PAGES), readahead in parallel (ASYNC_READ), and no OPEN at all where the kernel can do without
(OPEN answered ENOSYS: it then keeps a file's pages across opens, so a warm read never leaves the kernel).
What a node id names, and what a node holds, is the filesystem's (filesystem.py): the session passes ids,
offsets and names through and packs the typed answers. Unmounting makes every read fail with ENODEV: each
thread then ends.

A session given a connection's record (fuse/record.py) outlives its daemon: INIT's terms are written there
(the filesystem journals its node ids beside them), and a session started on a kept descriptor restores
them instead of waiting for INIT, then asks the kernel to resend what the daemon before read and never
answered (FUSE_NOTIFY_RESEND).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from shardfs import logs
from shardfs.fuse import wire
from shardfs.fuse.filesystem import BLOCK_SIZE, NAME_MAX, Filesystem, FuseError, StaleNode, count
from shardfs.fuse.listing import ListingWorkers
from shardfs.fuse.record import Record, Terms
from shardfs.fuse.wire import InitFlag, InitFlag2, Op
from shardfs.metrics import Metrics
from shardfs.request import Request

log = logging.getLogger("shardfs")

BUFFER = 64 * 1024  # a request never needs more: no writes, names up to 255 bytes, forgets batched to fit
MAX_WRITE = 4096  # the least the kernel accepts; nothing is written to a read-only tree
MAX_PAGES = 256  # reads of up to 1 MiB in one request
KERNEL_BACKGROUND = 12  # the kernel's default of asynchronous requests (readahead) in flight: never fewer
WANTED = InitFlag.ASYNC_READ | InitFlag.PARALLEL_DIROPS | InitFlag.MAX_PAGES
ZERO_ATTR = bytes(wire.ATTR.size)
READDIR_MOST = 32 << 10  # bytes of entries a READDIR answers: glibc asks st_blksize (1 MiB) after each seek
STATFS_UNIT = 512  # f_frsize: `df` shows the source's size to within half a KiB
# Opcodes answered ENOSYS: the kernel remembers most (FLUSH, FSYNC, xattrs, ACCESS, LSEEK, POLL, BMAP, STATX)
# and never asks again; locks are then kept by the kernel alone; for STATX it asks GETATTR instead.
NOT_IMPLEMENTED = frozenset(
    {
        Op.FLUSH, Op.FSYNC, Op.FSYNCDIR, Op.GETXATTR, Op.LISTXATTR, Op.ACCESS, Op.GETLK, Op.SETLK, Op.SETLKW,
        Op.BMAP, Op.POLL, Op.LSEEK, Op.SYNCFS, Op.SETUPMAPPING, Op.REMOVEMAPPING, Op.STATX,
    }
)  # fmt: skip
OPCODE_UNIQUE = struct.Struct("=IQ")  # fuse_in_header's opcode and unique, from its 4th byte
IOCTL = int(Op.IOCTL)
SIGNALS_SEEN_WITHIN = 0.5  # seconds: see run
UNANSWERED = frozenset({Op.FORGET, Op.BATCH_FORGET, Op.INTERRUPT, Op.NOTIFY_REPLY})  # the kernel waits on none
# With `allow_root`, what any user's request may still do (libfuse's set): the kernel's own housekeeping,
# and what follows an OPEN or OPENDIR that was checked.
ANY_USER = UNANSWERED | {
    Op.INIT, Op.DESTROY, Op.READ, Op.WRITE, Op.FSYNC, Op.RELEASE, Op.READDIR, Op.READDIRPLUS, Op.FSYNCDIR,
    Op.RELEASEDIR,
}  # fmt: skip


@dataclass(frozen=True)
class Timeouts:
    """How long the kernel may keep what it was told, in seconds: names, attributes, absences."""

    entry: float = 86400.0
    attr: float = 86400.0
    negative: float = 86400.0


@dataclass(frozen=True)
class Serving:
    """How a session serves, as the mount's options ask. threads: requests answered at once. kernel_cache: pages
    kept across opens where an OPEN is asked (no no_open). owner (`allow_root`): only that user's and root's
    requests are served, others answered EACCES, and every open is asked for (no no_open) so that a page
    cached for root is not read by another user. debug: every request and answer logged at DEBUG."""

    threads: int = 10
    timeouts: Timeouts = Timeouts()
    kernel_cache: bool = True
    owner: int | None = None
    debug: bool = False


def _split(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


class Session:
    """Serves a filesystem on an open /dev/fuse fd until the filesystem is unmounted, as serving says. on_ready
    runs once INIT is answered: the mount then answers requests (`granted_text` says on what terms). record:
    where INIT's terms are kept for the next daemon. taken_up: fd is a connection a daemon before served (its
    record given): INIT's terms are restored, not waited for, and what that daemon read and never answered is
    asked for again. metrics: the mount's, where its requests are counted."""

    def __init__(
        self, fd: int, filesystem: Filesystem, serving: Serving = Serving(),
        on_ready: Callable[[], None] | None = None, record: Record | None = None, taken_up: bool = False,
        metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        self.fd = fd
        self.metrics = metrics or Metrics()
        self.owner = serving.owner
        self.debug = serving.debug
        self.filesystem = filesystem
        self.threads = serving.threads
        self.record = record
        self.taken_up = taken_up
        self.listings = ListingWorkers()
        self.kernel_cache = serving.kernel_cache
        self.on_ready = on_ready
        self.no_open = False  # until INIT says whether the kernel takes ENOSYS for OPEN as "none needed"
        self.granted = InitFlag(0)
        self.interrupts = 0  # INTERRUPTs received, for tests and stats
        self._under_way: dict[int, Request] = {}  # requests read and not yet answered, by unique
        self._unmatched: dict[int, int] = {}  # INTERRUPTs read before the request they name: unique → its unique
        self.resend = False  # whether the kernel offered FUSE_HAS_RESEND
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._running = 0
        self._spared: set[int] = set()  # requests answered early whose threads still wait: a spare serves each
        self._retiring = 0  # spares to end: their requests' waits are over
        self.minor = 0
        timeouts = serving.timeouts
        self._entry_valid = (*_split(timeouts.entry), *_split(timeouts.attr))
        self._attr_valid = _split(timeouts.attr)
        self._negative = _split(timeouts.negative) if timeouts.negative > 0 else None
        self._handlers: dict[int, Callable[[Request, int, memoryview], None]] = {
            Op.INIT: self._init, Op.LOOKUP: self._lookup, Op.FORGET: self._forget,
            Op.BATCH_FORGET: self._batch_forget, Op.GETATTR: self._getattr, Op.OPEN: self._open,
            Op.READ: self._read, Op.RELEASE: self._ok, Op.OPENDIR: self._opendir, Op.READDIR: self._readdir,
            Op.RELEASEDIR: self._releasedir, Op.STATFS: self._statfs,
            Op.READLINK: self._not_a_link, Op.INTERRUPT: self._interrupt, Op.NOTIFY_REPLY: self._ignore,
            Op.DESTROY: self._ok,
        }  # fmt: skip

    def run(self) -> None:
        """Serve until unmounted (returns once every thread has ended) or stopped."""
        terms = self.record.terms() if self.taken_up and self.record is not None else None
        if terms is not None:
            self._restore(terms)
        elif self.taken_up:  # the daemon before died before answering INIT: if it had read it, it comes again
            self._resend(quiet=True)
        self._running = self.threads
        # Every thread is made before any reads the device: the mount is ready (INIT answered) only once the
        # daemon is whole, so that nothing a caller does after (a limit set on the process, say) finds it
        # still making threads.
        started = threading.Event()
        try:
            for i in range(self.threads):
                logs.start_thread(lambda: self._serve(started), f"fuse-{i}")
        finally:
            started.set()
        if terms is not None and self.on_ready is not None:
            self.on_ready()
        # Python runs a signal's handler in the main thread, but the kernel may give the signal to any thread
        # that does not block it (threads come and go: spares, obstore's); one that lands elsewhere does not
        # wake a main thread asleep on a lock. Waking twice a second bounds how long SIGUSR2 or SIGTERM waits.
        while not self._done.wait(SIGNALS_SEEN_WITHIN):
            pass

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

    def _serve(self, started: threading.Event | None = None) -> None:
        if started is not None:
            started.wait()
        try:
            self._loop()
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    self._done.set()

    def _loop(self) -> None:
        """Every thread reads the device and answers what it read: the kernel hands each request to one
        waiting reader, and a request that waits (on the store, the network) holds only its own thread. No
        request is handed on to another thread: each hand-off would be a wake-up and a fight for the GIL
        (docs/performance.md, Threads). The IOCTL that Python's `open()` sends for its isatty check, never
        kept by the kernel, is answered before any dispatch, since it comes with every warm `open()`."""
        buffer = bytearray(BUFFER)
        view = memoryview(buffer)
        while size := self._next(buffer):
            opcode, unique = OPCODE_UNIQUE.unpack_from(buffer, 4)
            if opcode == IOCTL:  # Python's open() asks if the file is a terminal (TCGETS): none is
                self._error(unique, errno.ENOTTY, counted=False)
            else:
                self._dispatch(view[:size])
            if self._retiring and self._retired():
                return

    def _retired(self) -> bool:
        """Whether this thread ends, one spare too many now that a request's wait is over."""
        with self._lock:
            if not self._retiring:
                return False
            self._retiring -= 1
            return True

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

    def _dispatch(self, buffer: memoryview) -> None:
        """One request answered: made a `Request` (kept by unique until answered, so that an INTERRUPT finds
        it), handed to its opcode's handler, errors answered as errno."""
        _, opcode, unique, nodeid, uid, gid, pid, *_ = wire.IN_HEADER.unpack_from(buffer)
        if unique & wire.UNIQUE_RESEND:
            self.metrics.resent.inc()
        body = buffer[wire.IN_HEADER.size :]
        handler = self._handlers.get(opcode)
        request = Request(unique, uid, gid, pid)
        if opcode not in UNANSWERED:
            self._under_way[unique] = request
            if self._unmatched:
                self._match_interrupts()
        if self.debug:
            log.debug(
                "request %d: %s node %d, uid %d, pid %d, %d bytes", unique, _name(opcode), nodeid, uid, pid,
                len(buffer), extra={"event": "fuse_request", "uid": uid},
            )  # fmt: skip
        try:
            if self.owner is not None and uid not in (0, self.owner) and opcode not in ANY_USER:
                self._error(unique, errno.EACCES, counted=False)
            elif handler is not None:
                handler(request, nodeid, body)
            elif opcode in wire.READ_ONLY_REFUSED:
                self._error(unique, errno.EROFS)
            else:
                self._error(unique, errno.ENOSYS, counted=opcode not in NOT_IMPLEMENTED)
        except FuseError as e:
            self._error(unique, e.errno, counted=False)  # counted where it was raised
        except StaleNode:
            log.error("request %s for unknown node %d", _name(opcode), nodeid, extra={"event": "bug", "uid": uid})
            self._error(unique, errno.ESTALE)
        except Exception:
            log.exception("%s failed", _name(opcode), extra={"event": "bug", "uid": uid})
            if opcode not in UNANSWERED:
                self._error(unique, errno.EIO)

    # Replies. A reply to a request the kernel has dropped meanwhile (interrupted: ENOENT) or to an
    # unmounted filesystem (ENODEV) goes nowhere, as it should.
    def _reply(self, unique: int, *parts: bytes) -> None:
        self._under_way.pop(unique, None)
        if self._spared:
            self._spare_done(unique)
        size = wire.OUT_HEADER.size + sum(map(len, parts))
        if self.debug:
            log.debug("answer %d: %d bytes", unique, size, extra={"event": "fuse_answer"})
        try:
            os.writev(self.fd, [wire.OUT_HEADER.pack(size, 0, unique), *parts])
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def _error(self, unique: int, code: int, counted: bool = True) -> None:
        self._under_way.pop(unique, None)
        if self._spared:
            self._spare_done(unique)
        if counted:
            count(self.metrics, code)
        if self.debug:
            log.debug("answer %d: %s", unique, errno.errorcode.get(code, code), extra={"event": "fuse_answer"})
        try:
            os.write(self.fd, wire.OUT_HEADER.pack(wire.OUT_HEADER.size, -code, unique))
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    # Requests
    def _init(self, request: Request, nodeid: int, body: memoryview) -> None:
        major, minor, max_readahead, flags = wire.INIT_IN.unpack_from(body)
        if major > wire.KERNEL_MAJOR:  # a newer kernel asks again, in our major
            self._reply(request.unique, wire.INIT_OUT.pack(wire.KERNEL_MAJOR, wire.OUR_MINOR, *(0,) * 9))
            return
        minor = min(minor, wire.OUR_MINOR)
        if major < wire.KERNEL_MAJOR or minor < wire.MIN_MINOR:
            log.error("kernel FUSE protocol %d.%d is too old (7.%d at least)", major, minor, wire.MIN_MINOR)
            self._error(request.unique, errno.EPROTO)
            return
        offered = InitFlag(flags)
        offered2 = 0
        if InitFlag.INIT_EXT in offered and len(body) >= wire.INIT_IN.size + wire.INIT_IN_FLAGS2.size:
            (offered2,) = wire.INIT_IN_FLAGS2.unpack_from(body, wire.INIT_IN.size)
        self.granted = WANTED & offered
        self.no_open = InitFlag.NO_OPEN_SUPPORT in offered and self.owner is None
        self.resend = minor >= wire.RESEND_MINOR and InitFlag2.HAS_RESEND in InitFlag2(offered2)  # what we speak
        self.minor = minor
        background = min(max(self.threads, KERNEL_BACKGROUND), 0xFFFF)
        if self.record is not None:  # before the answer: a connection kept from here on has its terms
            terms = Terms(minor, int(self.granted), max_readahead, MAX_WRITE, MAX_PAGES, 1, self.no_open, self.resend)
            self.record.settle(terms)
        reply = wire.INIT_OUT.pack(
            wire.KERNEL_MAJOR, minor, max_readahead, self.granted, background, background * 3 // 4,
            MAX_WRITE, 1, MAX_PAGES, 0, 0,
        )  # fmt: skip
        self._reply(request.unique, reply if minor >= 23 else reply[: wire.COMPAT_22_INIT_OUT_SIZE])
        if self.on_ready is not None:
            self.on_ready()

    def granted_text(self) -> str:
        """What INIT settled, for the mount's log line: `FUSE 7.40, granted ASYNC_READ|..., no_open, 10 threads`."""
        granted = "|".join(flag.name or "" for flag in InitFlag if flag in self.granted) or "nothing"
        taken_up = ", a kept connection taken up" if self.taken_up else ""
        no_open = ", no_open" if self.no_open else ""
        return f"FUSE 7.{self.minor}, granted {granted}{no_open}, {self.threads} threads{taken_up}"

    def _lookup(self, request: Request, nodeid: int, body: memoryview) -> None:
        # A name longer than NAME_MAX (the kernel passes up to 1,024 bytes) is absent without asking the source,
        # which would answer ENAMETOOLONG: any user could fill the log with that, and no dataset has one.
        name = len(body) - 1
        entry = None if name > NAME_MAX else self.filesystem.lookup(request, nodeid, bytes(body[:name]))
        if entry is None:
            if self._negative is None:
                self._error(request.unique, errno.ENOENT, counted=False)
            else:  # node id 0: the kernel keeps the absence for the negative timeout
                reply = wire.ENTRY_OUT.pack(0, 0, self._negative[0], 0, self._negative[1], 0)
                self._reply(request.unique, reply, ZERO_ATTR)
            return
        child, attributes = entry
        entry_s, entry_ns, attr_s, attr_ns = self._entry_valid
        reply = wire.ENTRY_OUT.pack(child, 0, entry_s, attr_s, entry_ns, attr_ns)
        self._reply(request.unique, reply, wire.ATTR.pack(child, *attributes))

    def _forget(self, request: Request, nodeid: int, body: memoryview) -> None:
        self.filesystem.forget(nodeid, wire.FORGET_IN.unpack_from(body)[0])

    def _batch_forget(self, request: Request, nodeid: int, body: memoryview) -> None:
        (number, _) = wire.BATCH_FORGET_IN.unpack_from(body)
        forget = self.filesystem.forget
        for i in range(number):
            forget(*wire.FORGET_ONE.unpack_from(body, wire.BATCH_FORGET_IN.size + i * wire.FORGET_ONE.size))

    def _getattr(self, request: Request, nodeid: int, body: memoryview) -> None:
        attributes = self.filesystem.getattr(request, nodeid)
        self._reply(request.unique, wire.ATTR_OUT.pack(*self._attr_valid, 0), wire.ATTR.pack(nodeid, *attributes))

    def _open(self, request: Request, nodeid: int, body: memoryview) -> None:
        """ENOSYS tells a kernel that can do without it not to ask again (FUSE no_open): it then sends
        neither OPEN nor RELEASE and keeps a file's pages across opens."""
        self.metrics.ops.labels("open").observe(0)  # so that `shardfs stats` shows whether the kernel still asks
        if self.no_open:
            self._error(request.unique, errno.ENOSYS, counted=False)
        else:
            self.filesystem.open(request, nodeid)
            self._reply(request.unique, wire.OPEN_OUT.pack(0, wire.FOPEN_KEEP_CACHE if self.kernel_cache else 0, 0))

    def _read(self, request: Request, nodeid: int, body: memoryview) -> None:
        _, offset, size, *_ = wire.READ_IN.unpack_from(body)
        self._reply(request.unique, self.filesystem.read(request, nodeid, offset, size))

    def _opendir(self, request: Request, nodeid: int, body: memoryview) -> None:
        """Handle 0: a directory handle carries nothing (see `_readdir`)."""
        self.filesystem.opendir(request, nodeid)
        self._reply(request.unique, wire.OPEN_OUT.pack(0, 0, 0))

    def _readdir(self, request: Request, nodeid: int, body: memoryview) -> None:
        """Answered at once from a listing already made; else a listing worker makes it and answers, in the
        turn of the user who asked, and this thread goes back to reading requests."""
        _, offset, size, *_ = wire.READ_IN.unpack_from(body)
        listing = self.filesystem.listed(nodeid)
        if listing is not None:
            self._reply(request.unique, listing.page(offset, min(size, READDIR_MOST)))
            return
        self.listings.submit(request.uid, lambda: self._dirents(request, nodeid, offset, size))

    def _dirents(self, request: Request, nodeid: int, offset: int, size: int) -> None:
        """The entries of directory nodeid from offset that fit in size bytes, or the error the listing met."""
        try:
            listing = self.filesystem.listing(request, nodeid)
        except FuseError as e:
            self._error(request.unique, e.errno, counted=False)  # counted where it was raised
            return
        except StaleNode:  # forgotten while the listing waited for a worker
            self._error(request.unique, errno.ESTALE)
            return
        self._reply(request.unique, listing.page(offset, min(size, READDIR_MOST)))

    def _releasedir(self, request: Request, nodeid: int, body: memoryview) -> None:
        """Nothing to let go of: a directory handle carries nothing."""
        self._reply(request.unique)

    def _statfs(self, request: Request, nodeid: int, body: memoryview) -> None:
        """The source's stored bytes as size and used, nothing free (read-only), in 512-byte units."""
        nbytes, files = self.filesystem.statfs()
        blocks = -(-nbytes // STATFS_UNIT)
        self._reply(request.unique, wire.STATFS_OUT.pack(blocks, 0, 0, files, 0, BLOCK_SIZE, NAME_MAX, STATFS_UNIT, 0))

    def _not_a_link(self, request: Request, nodeid: int, body: memoryview) -> None:
        self._error(request.unique, errno.EINVAL)

    def _ok(self, request: Request, nodeid: int, body: memoryview) -> None:
        self._reply(request.unique)

    def _interrupt(self, request: Request, nodeid: int, body: memoryview) -> None:
        """The request it names is told (`Request.interrupt`): one waiting on the network gives up and is
        answered EINTR (the kernel has answered a killed caller already), any other is answered when done.
        One not read yet by its thread is matched when it is (`_match_interrupts`)."""
        self.interrupts += 1
        (target,) = wire.INTERRUPT_IN.unpack_from(body)
        interrupted = self._under_way.get(target)
        if interrupted is not None:
            self._give_up(interrupted)
            return
        self._unmatched[request.unique] = target
        if target in self._under_way:  # registered meanwhile, after its thread looked for INTERRUPTs
            self._match_interrupts()

    def _give_up(self, request: Request) -> None:
        """An INTERRUPT delivered (`Request.interrupt`). A request that waits on the network is answered EINTR
        now (the kernel frees its caller, which a kill could not) and counted; its thread answers, too late,
        once the server has, and a spare thread serves in its place until then: at most `threads` spares, past
        which the session has fewer threads for that while. Any other request is answered when done."""
        if not request.interrupt():
            return
        self._error(request.unique, errno.EINTR)
        with self._lock:  # its thread answers after `waited`, then takes this lock: it finds the spare or none
            spare = request.waiting and self._running > 0 and len(self._spared) < self.threads
            if spare:
                self._spared.add(request.unique)
                self._running += 1
        if spare:
            logs.start_thread(self._serve, "fuse-spare")

    def _spare_done(self, unique: int) -> None:
        """A request is answered: if a spare served in its thread's place, one thread ends after its next."""
        with self._lock:
            if unique in self._spared:
                self._spared.discard(unique)
                self._retiring += 1

    def _match_interrupts(self) -> None:
        """INTERRUPTs that named no request under way, as libfuse keeps them: each whose request is now under
        way is delivered; one other is answered EAGAIN, so that the kernel sends it again if its request still
        waits (read by a thread not yet registering it), or drops it (answered meanwhile: ENOENT from the
        write). One a request: an INTERRUPT for a request no daemon will answer never spins a thread."""
        again = None
        for unique, target in list(self._unmatched.items()):
            interrupted = self._under_way.get(target)
            if interrupted is not None:
                if self._unmatched.pop(unique, None) is not None:
                    self._give_up(interrupted)
            elif again is None:
                again = unique
        if again is not None and self._unmatched.pop(again, None) is not None:
            self._error(again, errno.EAGAIN, counted=False)

    def _ignore(self, request: Request, nodeid: int, body: memoryview) -> None:
        """NOTIFY_REPLY: nothing is ever asked of the kernel, so nothing is expected back."""


def _name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return str(opcode)
