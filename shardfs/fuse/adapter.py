"""Tree answers as FUSE answers: nodes become attributes, listings stream through cursors, and exceptions
become errno with the same log lines and metrics as ever. It knows nothing of the wire but the attr struct."""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from shardfs.codecs import start_request
from shardfs.errors import CorruptChunk, over_max_file_size
from shardfs.fuse import wire
from shardfs.fuse.listing import Listing, ListingWorkers
from shardfs.metrics import Metrics
from shardfs.tree import Dir, Owner, Tree

log = logging.getLogger("shardfs")
F = TypeVar("F", bound=Callable[..., Any])

BLOCK_SIZE = 1 << 20  # st_blksize: tools such as cp size their reads by it
NAME_MAX = 255  # the longest name a Linux filesystem holds (STATFS says so); the kernel passes FUSE up to 1,024
REQUEST_FILES = 4  # a request may decode as much as this many of the largest files (nested shards, a view)


class FuseError(Exception):
    """A request answered with this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(errno.errorcode.get(code, str(code)))
        self.errno = code


def errors_to_errno(name: str) -> Callable[[F], F]:
    """Absent → ENOENT; corrupt data → EIO with a log line naming shard and key; a bug → EIO, logged.
    Every call is timed under name, and every error but ENOENT counted, for `--metrics` and `shardfs stats`.
    The wrapped method's first argument after self is the path, for the log lines."""

    def decorate(op: F) -> F:
        @functools.wraps(op)
        def wrapper(self: TreeOps, path: str, *args: Any) -> Any:
            start_request(self.request_limit, self.tree.cache)
            start = time.perf_counter()
            try:
                return op(self, path, *args)
            except FuseError as e:
                count(self.metrics, e.errno)
                raise
            except CorruptChunk as e:
                refused(self.metrics, e, self.tree.cache.max_value, path)
                raise error(self.metrics, errno.EIO) from None
            except (FileNotFoundError, NotADirectoryError):
                raise FuseError(errno.ENOENT) from None
            except OSError as e:
                log.error("%s: %s", name, e, extra={"event": "os_error", "path": "/" + path})
                raise error(self.metrics, e.errno or errno.EIO) from None
            except Exception:
                log.exception("%s failed", name, extra={"event": "bug", "path": "/" + path})
                raise error(self.metrics, errno.EIO) from None
            finally:
                self.metrics.ops.labels(name).observe(time.perf_counter() - start)

        @functools.wraps(op)
        def logged(self: TreeOps, path: str, *args: Any) -> Any:
            if not log.isEnabledFor(logging.DEBUG):
                return wrapper(self, path, *args)
            reads, start = self.metrics.store_reads.mine(), time.perf_counter()
            try:
                answer = wrapper(self, path, *args)
            except FuseError as e:
                log_request(self.metrics, name, path, start, reads, code=e.errno)
                raise
            log_request(self.metrics, name, path, start, reads, answer)
            return answer

        return logged  # type: ignore[return-value]

    return decorate


def log_request(
    metrics: Metrics, op: str, path: str, start: float, reads: float, answer: object = None, code: int = 0
) -> None:
    """The DEBUG line of one request: what was asked, how many bytes it answered or which errno, how many
    byte ranges it read from the source (this thread's count), and how long it took."""
    fields: dict[str, object] = {"event": "request", "op": op, "path": "/" + path}
    if isinstance(answer, bytes):
        fields["bytes"] = len(answer)
    if code or (answer is None and op == "getattr"):  # getattr's None: absent
        fields["errno"] = errno.errorcode.get(code or errno.ENOENT, code)
    fields["store_reads"] = int(metrics.store_reads.mine() - reads)
    fields["us"] = round((time.perf_counter() - start) * 1e6)
    log.debug("answered", extra=fields)


def refused(metrics: Metrics, e: CorruptChunk, max_file_size: int, path: str) -> None:
    """Log and count a chunk that cannot be served: too large for --max-file-size (the operator can raise it),
    else corrupt."""
    if (too_large := over_max_file_size(e, max_file_size)) is not None:
        metrics.over_max_file_size.inc()
        log.error("%s", too_large, extra={**e.log_fields("too_large"), "path": "/" + path})
    else:
        metrics.decode_errors.inc()
        log.error("%s", e, extra={**e.log_fields("eio"), "path": "/" + path})


def count(metrics: Metrics, code: int) -> None:
    """Count an error answer for the metrics (ENOENT is an answer, not an error)."""
    if code != errno.ENOENT:
        metrics.errors.labels(errno.errorcode.get(code, str(code))).inc()


def error(metrics: Metrics, code: int) -> FuseError:
    count(metrics, code)
    return FuseError(code)


class StoredBytes:
    """What `df` shows: the bytes and files the source stores, counted once, in a thread of its own started at
    the first STATFS (a mount waits for nothing, and one no one asks costs nothing). Until the count is done
    STATFS answers what it has counted so far; it stops at MAX_FILES files, or where the source's listing
    stops (a remote walk's bounds: `df` then shows a lower bound).
    A source that cannot be listed (HTTP) counts nothing: size 0."""

    MAX_FILES = 1_000_000

    def __init__(self, sizes: Callable[[], Iterator[int]]) -> None:
        self._sizes = sizes
        self._started = threading.Event()
        self.nbytes = self.files = 0

    def now(self) -> tuple[int, int]:
        """(bytes, files) counted so far; the first call starts the count."""
        if not self._started.is_set():
            self._started.set()
            threading.Thread(target=self._count, name="shardfs-df", daemon=True).start()
        return self.nbytes, self.files

    def _count(self) -> None:
        try:
            for size in itertools.islice(self._sizes(), self.MAX_FILES):
                self.nbytes, self.files = self.nbytes + size, self.files + 1
        except Exception as e:  # a listing refused or failed: df shows what was counted
            log.warning("df: the source's size could not be counted: %s", e, extra={"event": "statfs"})


@dataclass(frozen=True)
class Shown:
    """libfuse's `-o uid=N,gid=N,umask=M`: every node shown with that owner, group, or permission bits
    `0777 & ~M` in place of its source's (None: the source's)."""

    uid: int | None = None
    gid: int | None = None
    umask: int | None = None


class TreeOps:
    """Read-only operations over a Tree, by path ('' is the root). The session owns node ids and the
    wire; this owns what the answers say."""

    def __init__(self, tree: Tree, mtime_ns: int, shown: Shown = Shown(), metrics: Metrics | None = None) -> None:
        """metrics: the mount's, where its answers are counted."""
        self.tree = tree
        self.metrics = metrics or Metrics()
        self.shown = shown
        self.request_limit = REQUEST_FILES * tree.cache.max_value  # decoded bytes one request may make
        self._times = (*divmod(mtime_ns, 1_000_000_000),)
        self.listings = ListingWorkers()
        self._modes = functools.lru_cache(maxsize=1024)(self._mode)
        self.stored = StoredBytes(tree.store.sizes)

    def _mode(self, kind: int, owner: Owner) -> tuple[int, int, int, int]:
        """(st_mode, st_nlink, uid, gid) of a node owned by owner (few distinct ones: cached). Files get
        read bits only; directories read and search; unless `shown` says otherwise."""
        mode = owner.mode if kind == stat.S_IFDIR else owner.mode & 0o444
        shown = self.shown
        if shown.umask is not None:
            mode = 0o777 & ~shown.umask
        uid = owner.uid if shown.uid is None else shown.uid
        gid = owner.gid if shown.gid is None else shown.gid
        return kind | mode, 2 if kind == stat.S_IFDIR else 1, uid, gid

    @errors_to_errno("getattr")
    def attributes(self, path: str) -> tuple[int, ...] | None:
        """The fuse_attr fields after ino of the node at path (pack with `attr`), or None if there is
        none: a negative entry for the kernel to keep."""
        try:
            node = self.tree.lookup(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if isinstance(node, Dir):
            mode, nlink, uid, gid = self._modes(stat.S_IFDIR, node.owner)
            size = 0
        else:
            mode, nlink, uid, gid = self._modes(stat.S_IFREG, node.owner)
            size = node.size()
        sec, nsec = self._times
        return size, (size + 511) // 512, sec, sec, sec, nsec, nsec, nsec, mode, nlink, uid, gid, 0, BLOCK_SIZE, 0

    @errors_to_errno("read")
    def read(self, path: str, offset: int, size: int) -> bytes:
        node = self.tree.lookup(path)
        if isinstance(node, Dir):
            raise error(self.metrics, errno.EISDIR)
        data = node.read(offset, size)
        self.metrics.served.inc(len(data))
        return data

    @errors_to_errno("opendir")
    def opendir(self, path: str) -> None:
        """A directory handle holds nothing: its listing is the directory's (`listed`), and an offset is
        all the kernel needs to resume it."""
        if not isinstance(self.tree.lookup(path), Dir):
            raise error(self.metrics, errno.ENOTDIR)

    def listed(self, path: str) -> Listing | None:
        """The directory's listing if it is made already (answering from it waits on nothing), else None."""
        return self.tree.cache.get(("listing", path))  # type: ignore[return-value]

    def listing(self, path: str, ino: Callable[[str], int]) -> Listing:
        """The directory's listing, made here if it is not made yet (the session asks for that in a listing
        worker), within its bounds; ino: the inode number an entry shows, by name. EIO if it cannot be made."""
        start_request(self.request_limit, self.tree.cache)
        start, reads, code = time.perf_counter(), self.metrics.store_reads.mine(), 0
        try:
            make = lambda: Listing.of(self.tree.listdir(path), "/" + path, ino)  # noqa: E731
            return self.tree.cache.get_or_make(("listing", path), make)
        except Exception as e:
            log.error("listing failed: %s", e, extra={"event": "eio", "path": "/" + path})
            code = errno.EIO
            raise error(self.metrics, errno.EIO) from None
        finally:
            self.metrics.ops.labels("readdir").observe(time.perf_counter() - start)
            if log.isEnabledFor(logging.DEBUG):
                log_request(self.metrics, "readdir", path, start, reads, code=code)


def attr(ino: int, fields: tuple[int, ...]) -> bytes:
    """A fuse_attr: the node's number, then what `TreeOps.attributes` found."""
    return wire.ATTR.pack(ino, *fields)
