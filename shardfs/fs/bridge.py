"""The bridge: the virtual tree served as a `Filesystem` (fuse/filesystem.py), by node id.

It owns the node ids (nodes.py): a numbered file's id is its key, so a request for a chunk goes from its id
to its node with no name made or parsed; any other id names a path in the table, located (its provider found)
once, so a LOOKUP goes from its parent's node and the name to the child's with no walk up the path. Tree
nodes become attributes, directories listings, and exceptions errno, each error logged with the path it
concerns and counted. The session above it knows no path; the tree below it knows no FUSE.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

from shardfs import logs
from shardfs.errors import CorruptChunk, over_max_file_size
from shardfs.files import Dir
from shardfs.fs.nodes import Nodes
from shardfs.fs.readahead import ReadAhead
from shardfs.fuse.filesystem import BLOCK_SIZE, Attributes, Entry, FuseError, Usage, count, error
from shardfs.fuse.listing import Listing
from shardfs.fuse.record import Record
from shardfs.fuse.serve import Shown
from shardfs.metrics import Metrics
from shardfs.request import Request
from shardfs.stores.protocol import Owner
from shardfs.tree import Located, Place, Tree

log = logging.getLogger("shardfs")
F = TypeVar("F", bound=Callable[..., Any])

FS_ENCODING = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())  # os.fsdecode's, without its call
# Makes an Attributes from a tuple of its fields without the NamedTuple's own __new__, a Python call that
# would cost every LOOKUP and GETATTR more than the protocol saves it.
_attributes = tuple.__new__
REQUEST_FILES = 4  # a request may decode as much as this many of the largest files (nested shards, a view)


def errors_to_errno(name: str) -> Callable[[F], F]:
    """Absent → ENOENT; corrupt data → EIO with a log line naming shard and key; a bug → EIO, logged;
    interrupted while it waited on the network → EINTR (its caller has gone or been signalled: counted as an
    interrupted remote request, nothing logged). Every call is timed under name, and every other error but ENOENT
    counted, for `--metrics` and `shardfs stats`. The wrapped method's arguments after self are the request (given
    its decode budget here; its uid names it in the log lines, against that user's budget of lines) and the
    node's place: its path is made for a log line only."""

    def decorate(op: F) -> F:
        @functools.wraps(op)
        def wrapper(self: Bridge, request: Request, place: Place, *args: Any) -> Any:
            request.budget(self.request_limit)
            start = time.perf_counter()
            try:
                return op(self, request, place, *args)
            except FuseError as e:
                count(self.metrics, e.errno)
                raise
            except CorruptChunk as e:
                refused(self.metrics, e, self.tree.cache.max_value, self.path_of(place), request.uid)
                raise error(self.metrics, errno.EIO) from None
            except (FileNotFoundError, NotADirectoryError):
                raise FuseError(errno.ENOENT) from None
            except InterruptedError:
                raise FuseError(errno.EINTR) from None
            except OSError as e:
                where = {"path": "/" + self.path_of(place), "uid": request.uid}
                log.error("%s: %s", name, e, extra={"event": "os_error", **where})
                raise error(self.metrics, e.errno or errno.EIO) from None
            except Exception:
                log.exception("%s failed", name, extra={"event": "bug", "path": "/" + self.path_of(place),
                                                        "uid": request.uid})  # fmt: skip
                raise error(self.metrics, errno.EIO) from None
            finally:
                self.metrics.ops.labels(name).observe(time.perf_counter() - start)

        @functools.wraps(op)
        def logged(self: Bridge, request: Request, place: Place, *args: Any) -> Any:
            if not log.isEnabledFor(logging.DEBUG):
                return wrapper(self, request, place, *args)
            reads, start = self.metrics.store_reads.mine(), time.perf_counter()
            asked = Asked(name, self.path_of(place), request.uid, start, reads)
            try:
                answer = wrapper(self, request, place, *args)
            except FuseError as e:
                log_request(self.metrics, asked, code=e.errno)
                raise
            log_request(self.metrics, asked, answer)
            return answer

        return logged  # type: ignore[return-value]

    return decorate


class Asked(NamedTuple):
    """What a request asked, for its DEBUG line: op, the node's path, the user who asked, and when it started
    with this thread's count of store reads then."""

    op: str
    path: str
    uid: int | None
    start: float
    reads: float


def log_request(metrics: Metrics, asked: Asked, answer: object = None, code: int = 0) -> None:
    """The DEBUG line of one request: what was asked and by whom, how many bytes it answered or which errno, how
    many byte ranges it read from the source (this thread's count), and how long it took."""
    fields: dict[str, object] = {"event": "request", "op": asked.op, "path": "/" + asked.path}
    if isinstance(answer, bytes):
        fields["bytes"] = len(answer)
    if code or (answer is None and asked.op in ("lookup", "getattr")):  # their None: absent
        fields["errno"] = errno.errorcode.get(code or errno.ENOENT, code)
    fields["store_reads"] = int(metrics.store_reads.mine() - asked.reads)
    fields["us"] = round((time.perf_counter() - asked.start) * 1e6)
    fields["uid"] = asked.uid
    log.debug("answered", extra=fields)


def refused(metrics: Metrics, e: CorruptChunk, max_file_size: int, path: str, uid: int | None) -> None:
    """Log and count a chunk that cannot be served: too large for --max-file-size (the operator can raise it),
    else corrupt. uid: whose request met it (the line counts against that user's budget)."""
    if (too_large := over_max_file_size(e, max_file_size)) is not None:
        metrics.over_max_file_size.inc()
        log.error("%s", too_large, extra={**e.log_fields("too_large"), "path": "/" + path, "uid": uid})
    else:
        metrics.decode_errors.inc()
        log.error("%s", e, extra={**e.log_fields("eio"), "path": "/" + path, "uid": uid})


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
            logs.start_thread(self._count, "shardfs-df")
        return self.nbytes, self.files

    def _count(self) -> None:
        try:
            for size in itertools.islice(self._sizes(), self.MAX_FILES):
                self.nbytes, self.files = self.nbytes + size, self.files + 1
        except Exception as e:  # a listing refused or failed: df shows what was counted
            log.warning("df: the source's size could not be counted: %s", e, extra={"event": "statfs"})


class Bridge:
    """The tree as a `Filesystem`: node ids to the tree's nodes and back (see the module's docstring).
    record: where the node table is journalled for the next daemon, and restored from. metrics: the mount's,
    where its answers are counted."""

    def __init__(
        self, tree: Tree, mtime_ns: int, shown: Shown | None = None, record: Record | None = None,
        metrics: Metrics | None = None, read_ahead: int = 0,
    ) -> None:  # fmt: skip
        self.tree = tree
        self.metrics = metrics or Metrics()
        self.shown = Shown() if shown is None else shown
        self.nodes = Nodes(tree, record)
        self.request_limit = REQUEST_FILES * tree.cache.max_value  # decoded bytes one request may make
        self._times = (*divmod(mtime_ns, 1_000_000_000),)
        self._modes = functools.lru_cache(maxsize=1024)(self._mode)
        self.usage = StoredBytes(tree.store.sizes)
        # read_ahead: the most files fetched ahead (readahead.py); only where reads wait on a network
        self.read_ahead = ReadAhead(tree, self.metrics, read_ahead if tree.store.reads_at_once > 1 else 0)

    def close(self) -> None:
        """The mount has ended: work ahead is dropped."""
        self.read_ahead.close()

    # The protocol: by node id.
    def lookup(self, request: Request, parent: int, name: bytes) -> Entry | None:
        place = self.tree.child(self.nodes.located(parent), name.decode(*FS_ENCODING))
        attributes = self._looked_up(request, place)
        if attributes is None:
            return None
        if not isinstance(place, Located):
            self.read_ahead.looked_up(*place)
        return self.nodes.looked_up(place), attributes

    def forget(self, node: int, lookups: int) -> None:
        self.nodes.forget(node, lookups)

    def getattr(self, request: Request, node: int) -> Attributes:
        attributes = self._getattr(request, self.nodes.place(node))
        if attributes is None:
            raise FuseError(errno.ENOENT)
        return attributes

    def open(self, request: Request, node: int) -> None:
        """Permissions are the kernel's (`default_permissions`); writes are refused by the `ro` mount."""
        self.nodes.place(node)

    def read(self, request: Request, node: int, offset: int, size: int) -> bytes:
        return self._read(request, self.nodes.place(node), offset, size)

    def opendir(self, request: Request, node: int) -> None:
        self._opendir(request, self.nodes.located(node))

    def listed(self, node: int) -> Listing | None:
        return self.tree.cache.get(("listing", self.nodes.located(node).path))  # type: ignore[return-value]

    def listing(self, request: Request, node: int) -> Listing:
        """Made within its bounds (its own: a listing is shared by whoever waits for it, so it is the mount's
        work, not request's, and no interrupt of one reader ends it); EIO if it cannot be made."""
        directory = self.nodes.located(node)
        path = directory.path
        start, reads, code = time.perf_counter(), self.metrics.store_reads.mine(), 0
        ino = self.nodes.ino

        def make() -> Listing:
            return Listing.of(self.tree.listdir(path), "/" + path, lambda name: ino(directory, name))

        try:
            return self.tree.cache.get_or_make(("listing", path), make)
        except Exception as e:
            log.error("listing failed: %s", e, extra={"event": "eio", "path": "/" + path, "uid": request.uid})
            code = errno.EIO
            raise error(self.metrics, errno.EIO) from None
        finally:
            self.metrics.ops.labels("readdir").observe(time.perf_counter() - start)
            if log.isEnabledFor(logging.DEBUG):
                log_request(self.metrics, Asked("readdir", path, request.uid, start, reads), code=code)

    def statfs(self) -> Usage:
        return Usage(*self.usage.now())

    # What a node's place holds.
    def path_of(self, place: Place) -> str:
        """The path of a place, for log lines."""
        if isinstance(place, Located):
            return place.path
        return self.tree.path_of(*place) or f"{place}"

    def _mode(self, file_type: int, owner: Owner) -> tuple[int, int, int, int]:
        """(st_mode, st_nlink, uid, gid) of a node owned by owner (few distinct ones: cached). Files get
        read bits only; directories read and search; unless `shown` says otherwise."""
        mode = owner.mode if file_type == stat.S_IFDIR else owner.mode & 0o444
        shown = self.shown
        if shown.umask is not None:
            mode = 0o777 & ~shown.umask
        uid = owner.uid if shown.uid is None else shown.uid
        gid = owner.gid if shown.gid is None else shown.gid
        return file_type | mode, 2 if file_type == stat.S_IFDIR else 1, uid, gid

    def _attributes(self, request: Request, place: Place) -> Attributes | None:
        """The attributes of the node at place, or None if there is none: a negative entry for the kernel
        to keep. A numbered file is found by its key, anything else by its path."""
        try:
            node = self.tree.node(place, request)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if isinstance(node, Dir):
            mode, nlink, uid, gid = self._modes(stat.S_IFDIR, node.owner)
            size = 0
        else:
            mode, nlink, uid, gid = self._modes(stat.S_IFREG, node.owner)
            size = node.size()
        sec, nsec = self._times
        fields = (size, (size + 511) // 512, sec, sec, sec, nsec, nsec, nsec, mode, nlink, uid, gid, 0, BLOCK_SIZE, 0)
        return _attributes(Attributes, fields)

    _looked_up = errors_to_errno("lookup")(_attributes)  # LOOKUP and GETATTR ask the same, timed apart
    _getattr = errors_to_errno("getattr")(_attributes)

    @errors_to_errno("read")
    def _read(self, request: Request, place: Place, offset: int, size: int) -> bytes:
        if offset == 0:
            self.metrics.files_read.inc()
            if not isinstance(place, Located):  # a numbered file's first bytes: what follows may be next
                self.read_ahead.read(*place)
        node = self.tree.node(place, request)
        if isinstance(node, Dir):
            raise error(self.metrics, errno.EISDIR)
        data = node.read(offset, size, request)
        self.metrics.served.inc(len(data))
        return data

    @errors_to_errno("opendir")
    def _opendir(self, request: Request, place: Located) -> None:
        """A directory handle holds nothing: its listing is the directory's (`listed`), and an offset is
        all the kernel needs to resume it."""
        if not isinstance(self.tree.node(place, request), Dir):
            raise error(self.metrics, errno.ENOTDIR)
