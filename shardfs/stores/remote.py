"""Byte ranges from an object store or a web server (gs://, s3://, http(s)://), through obstore.

One obstore client per daemon process, shared by every FUSE session thread: obstore releases the GIL, keeps
connections alive, and retries 429, 5xx and timeouts with backoff, all within one deadline per request.
Every answer becomes what a local disk would say: a missing object is ENOENT, a refusal EACCES, anything
the retries could not get past EIO (never ENOENT: a server error must not look like an absent chunk).

Every byte range is tied to the version its object was opened at, so an index never meets bytes of another
version. An object is opened by a HEAD, or by the first GET of a range where one is needed anyway (a shard's
index; at a zarr shard's end, a suffix range `bytes=-N`, its size being unknown): that answer names the
version (Content-Range's total size, ETag, Last-Modified) of the very bytes it carries, so a shard costs no
HEAD. Each later GET sends the strongest precondition that version allows
(If-Match for an ETag, If-Unmodified-Since for a Last-Modified date), and its answer is compared with the
version too (size, ETag, Last-Modified), since a server may ignore preconditions. A server that sends
neither header leaves only the size to compare: its ranges are never kept on disk. A body is read no
further than one byte past the range asked, so no answer costs more memory than its request.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import obstore
from cachetools import LRUCache
from obstore.exceptions import NotSupportedError, PermissionDeniedError, PreconditionError, UnauthenticatedError
from obstore.store import GCSStore, HTTPStore, S3Store

from shardfs.cache import key_cost
from shardfs.context import Context
from shardfs.errors import SourceError
from shardfs.options import DEFAULT_TIMEOUT
from shardfs.request import OWN, Request
from shardfs.stores import credentials
from shardfs.stores.disk_cache import DiskCache
from shardfs.stores.location import Remote
from shardfs.stores.protocol import ByteRange, Owner, Range, StoreChanged, StoredFile

log = logging.getLogger("shardfs")

READS_AT_ONCE = 64  # requests a listing keeps in flight: its round trips overlap, within a bound
# One paginated walk (a directory's listing, `df`'s count) ends, with what it has, at the first of these: a
# server that answers "more to come" forever, with objects or without, is then one more slow listing.
LISTING_PAGE = 1000  # objects one request asks for (S3's and GCS's most)
LISTING_REQUESTS = 10_000  # requests one walk may make: 10 million objects where every page is full
LISTING_BYTES = 64 << 20  # bytes of object names one walk may gather
LISTING_TIMEOUTS = 4  # one walk may take this many --timeout (2 minutes by default)
SKIP = "\U0010ffff"  # sorts after every character: `d/` + SKIP sorts after every key below `d/`
# What remembering objects' sizes and versions (and absences) may cost, counted as measured (`_remembered_cost`):
# some 10,000 objects, 400 bytes each. An object forgotten is opened again (one request) when next read.
REMEMBERED_BYTES = 4 << 20
TABLE_ENTRY = 200  # cachetools' LRU per key: an entry in each of its three tables (measured: 168 bytes)
T = TypeVar("T")
CLOUDS = {"s3": "Amazon S3", "gs": "Google Cloud Storage"}  # where a bucket is when no --endpoint says otherwise
Listed = Generator[tuple[str, bool], None, str | None]  # entries, then where a listing goes on


def _waited(call: Callable[[], T], request: Request) -> T:
    """call(), for request. A FUSE request's thread makes the call itself (a thread made for each wait doubled the
    CPU a cold file costs, and a kept one still cost 4-7% of 16 cold readers' rate: docs/benchmarks.md), saying that
    it waits: an INTERRUPT meanwhile is answered EINTR by the session (a killed caller waits, unkillable, for an
    answer), and this thread drops the server's answer when it comes (InterruptedError, within --timeout). The
    daemon's own work waits in its own thread; in the main thread (the CLI), call() runs in a thread of its own,
    since obstore waits in Rust, where Python runs no signal handler until it returns: Ctrl-C would wait out a hung
    server's --timeout, retries included."""
    if request is OWN:
        return _in_a_thread(call) if threading.current_thread() is threading.main_thread() else call()
    if not request.waits():
        raise _interrupted()
    try:
        answer = call()
    finally:
        answered = request.waited()
    if not answered:
        raise _interrupted()
    return answer


def _in_a_thread(call: Callable[[], T]) -> T:
    """call(), in a thread of its own while this one waits on an event, which a signal interrupts: Ctrl-C
    (KeyboardInterrupt) leaves the call to end by itself, its answer dropped."""
    answer: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            answer.append((True, call()))
        except BaseException as e:  # handed to the waiting thread, as if raised there
            answer.append((False, e))
        finally:
            done.set()

    threading.Thread(target=run, name="shardfs-request", daemon=True).start()
    done.wait()
    ok, value = answer[0]
    if not ok:
        raise value
    return value


def _interrupted() -> InterruptedError:
    return InterruptedError(errno.EINTR, "interrupted: the kernel has answered the caller")


@dataclass(frozen=True, slots=True)
class Access:
    """How to reach a remote source: --anonymous, --endpoint, --region, --timeout, --profile, --requester-pays;
    machine: whether the machine's own cloud identity may sign (see credentials.aws)."""

    anonymous: bool = False
    endpoint: str | None = None
    region: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    profile: str | None = None
    requester_pays: bool = False
    machine: bool = True


def client_options(access: Access, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Timeouts and retries that keep a request, retries included, within access.timeout (t): each attempt,
    connecting and the whole body included, may take t/2; a failed attempt is retried only if it ended
    within 3t/8 of the first one's start, after a backoff of at most t/8. The last retry thus starts by
    t/2 and ends by t. (obstore decides on a retry when an attempt fails, then waits, then tries again.)"""
    t = access.timeout
    options = {
        "timeout": timedelta(seconds=t / 2),
        "connect_timeout": timedelta(seconds=t / 2),
        "allow_http": url.startswith("http://"),
    }
    retry = {
        "max_retries": 10,
        "retry_timeout": timedelta(seconds=3 * t / 8),
        "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=t / 8), "base": 2},
    }
    return options, retry


def make_client(remote: Remote, access: Access) -> tuple[Any, bool]:
    """The obstore store for a remote source, and whether its requests are signed: unsigned when asked or when
    no credentials are found (see shardfs/stores/credentials.py for where they are looked for)."""
    endpoint = access.endpoint or ""
    options, retry = client_options(access, endpoint or remote.url)
    common: dict[str, Any] = {"client_options": options, "retry_config": retry}
    if remote.scheme in ("http", "https"):
        if remote.authorization:  # the URL's user:password; reqwest drops it on a redirect to another host
            options["default_headers"] = {"authorization": remote.authorization}
        return HTTPStore(remote.address, **common), bool(remote.authorization)
    prefix = remote.prefix or None
    if remote.scheme == "s3":
        provider = None if access.anonymous else credentials.aws(remote.url, access.profile, access.machine)
        config: dict[str, Any] = {"skip_signature": provider is None, "request_payer": access.requester_pays}
        if endpoint:
            config["endpoint"] = endpoint
        if access.region:
            config["region"] = access.region  # else the profile's, or AWS_DEFAULT_REGION, or us-east-1
        _say_unsigned(remote, access, provider is not None)
        return S3Store(remote.bucket, prefix=prefix, config=config, credential_provider=provider, **common), bool(
            provider
        )
    if access.requester_pays:  # GCS bills the requester through a userProject, which object_store never sends
        raise SourceError(f"{remote.url}: --requester-pays is for s3:// sources; object_store cannot name a GCS "
                          "billing project")  # fmt: skip
    signed = not access.anonymous and credentials.gcs(remote.url, access.machine)
    config = {"skip_signature": not signed}
    if endpoint:
        config["base_url"] = endpoint
    _say_unsigned(remote, access, signed)
    return GCSStore(remote.bucket, prefix=prefix, config=config, **common), signed


def _say_unsigned(remote: Remote, access: Access, signed: bool) -> None:
    if not signed and not access.anonymous:
        log.info("%s: no credentials found; requests are sent unsigned", remote.url, extra={"event": "unsigned"})


@dataclass(frozen=True, slots=True)
class Absent:
    """An object found not to exist, remembered as such."""

    path: str


def _remembered_cost(found: StoredFile | Absent) -> int:
    """What remembering found costs: its path (the table's key too), itself, its version and the table's entry."""
    return key_cost(found.path) + sys.getsizeof(found) + key_cost(getattr(found, "version", ())) + TABLE_ENTRY


class RemoteStore:
    """The Store protocol over obstore. Objects have no owner: everything is shown as the daemon's user's,
    readable by all. A directory is a key prefix; HTTP servers cannot list, so there a directory lists
    as empty and only what metadata names is found."""

    piece_size = 8 << 20  # one GET for nearly every chunk, yet a bounded part of a large one
    reads_at_once = READS_AT_ONCE

    def __init__(
        self, remote: Remote, access: Access, disk: DiskCache | None = None, context: Context | None = None
    ) -> None:
        """disk: where byte ranges are kept across mounts (--cache-dir), if anywhere. context: the mount's, where
        its requests are counted and tracked."""
        self.remote, self.access, self.disk = remote, access, disk
        self.context = context or Context()
        self._owner = Owner(os.getuid(), os.getgid(), 0o555)
        self._lock = threading.Lock()
        self._client: tuple[int, Any, bool] | None = None  # (pid, client, signed)
        self._reads: tuple[int, ThreadPoolExecutor] | None = None
        self._opened: LRUCache[str, StoredFile | Absent] = LRUCache(REMEMBERED_BYTES, getsizeof=_remembered_cost)
        self._said_unversioned = False
        self._suffixes = True  # until the server refuses a suffix range

    @property
    def can_list(self) -> bool:
        """Object stores list by key prefix; a web server has no listing to ask for."""
        return self.remote.scheme in ("gs", "s3")

    def _store(self) -> Any:
        """The client of this process: obstore's runtime threads do not survive the daemon's fork, so a
        client is made where it is used, once."""
        made = self._client
        if made is None or made[0] != os.getpid():
            with self._lock:
                made = self._client
                if made is None or made[0] != os.getpid():
                    made = self._client = (os.getpid(), *make_client(self.remote, self.access))
        return made[1]

    @property
    def signed(self) -> bool:
        """Whether requests carry credentials (found, or the URL's user:password); the client is made if not yet."""
        self._store()
        return bool(self._client and self._client[2])

    def reads(self) -> Executor:
        """The threads every listing's reads run in, READS_AT_ONCE for the process, however many listings are
        under way: made where first used, as the client is."""
        made = self._reads
        if made is None or made[0] != os.getpid():
            with self._lock:
                made = self._reads
                if made is None or made[0] != os.getpid():
                    pool = ThreadPoolExecutor(READS_AT_ONCE, thread_name_prefix="shardfs-listing-read")
                    made = self._reads = (os.getpid(), pool)
        return made[1]

    def _call(self, what: str, path: str, call: Callable[[], T], request: Request = OWN) -> T:
        """One request to the server (retries included), for request (a FUSE request's is given up when the
        kernel interrupts it: InterruptedError), counted and timed; obstore's errors as a disk's errno, with the
        reason in the error (not logged here: whoever handles it logs it or prints it, once)."""
        started = time.monotonic()
        outcome = "ok"
        try:
            return _waited(lambda: self.context.waiting.run(what, self.where(path), call), request)
        except InterruptedError:  # the kernel has answered its caller: the server's answer goes nowhere
            outcome = "interrupted"
            raise
        except FileNotFoundError:
            outcome = "not_found"
            raise FileNotFoundError(errno.ENOENT, "not in the source", self.where(path)) from None
        except StoreChanged:
            outcome = "changed"
            raise
        except BadAnswer:
            outcome = "bad_answer"
            raise
        except NoSuffixRanges:
            outcome = "no_suffix_ranges"
            raise
        except (PermissionDeniedError, UnauthenticatedError) as e:
            outcome = "denied"
            why = f"access denied by the server: {_first_line(e)}"
            raise PermissionError(errno.EACCES, why, self.where(path)) from None
        except SourceError:  # no client could be made (credentials): the mount's reason, not the server's
            outcome = "refused"
            raise
        except Exception as e:  # 5xx and timeouts once retries are spent, refused connections, bad answers
            outcome = "failed"
            if self.remote.scheme in CLOUDS and "<Code>NoSuchBucket</Code>" in str(e):
                raise NoBucket(self.remote, self.access, self.where(path)) from None
            raise OSError(errno.EIO, f"{what} failed: {_first_line(e)}", self.where(path)) from None
        except KeyboardInterrupt:  # Ctrl-C while the main thread waited: the request goes on, unanswered
            outcome = "interrupted"
            raise
        finally:
            self.context.metrics.remote_requests.labels(what, outcome).inc()
            self.context.metrics.remote_seconds.labels(what).observe(time.monotonic() - started)

    # -- the Store protocol -------------------------------------------------------------------------------------------

    def open(self, path: str) -> StoredFile:
        """The object's size and version, from one HEAD, remembered (absence too): the data is immutable
        while mounted, and a shard's size is needed by every read of it. A name no object can have is absent,
        with no request sent."""
        found = self._known(path)
        if found is None:
            try:
                meta = self._call("head", path, lambda: obstore.head(self._store(), path))
                found = self._remember(path, self._file(path, meta))
            except FileNotFoundError:
                found = self._remember(path, Absent(path))
        if isinstance(found, Absent):
            raise self._absent(path)
        return found

    def open_reading(self, path: str, want: ByteRange, request: Request = OWN) -> tuple[StoredFile, bytes]:
        """The object's version and the bytes want asks for, in one GET where the version is not known yet: the
        answer names it (Content-Range's total size, ETag, Last-Modified), so no HEAD goes first, and the bytes
        are surely of that version. A Suffix is a suffix range (`bytes=-n`); a server that refuses those (some
        answer the whole object) is not asked again: there a HEAD goes first. A version already known is read
        as any range is, under its precondition."""
        found = self._known(path)
        if found is None and isinstance(want, Range):
            get = lambda: self._get_first(path, want.offset, want.offset + want.length)  # noqa: E731
            return self._open_by(path, get, request)
        if found is None and self._suffixes:
            try:
                return self._open_by(path, lambda: self._get_tail(path, want.length), request)
            except NoSuffixRanges:
                self._refuse_suffixes()
        file = found or self.open(path)
        return file, file.read(*want.within(file.size), request)

    def _open_by(
        self, path: str, get: Callable[[], tuple[StoredFile, bytes, int]], request: Request
    ) -> tuple[StoredFile, bytes]:  # fmt: skip
        """The version and bytes that get()'s one GET answered (with where they start), remembered and
        counted."""
        try:
            file, data, start = self._call("get", path, get, request)
        except FileNotFoundError:
            self._remember(path, Absent(path))
            raise
        if (opened := self._remember(path, file)) != file:  # another thread found another version, or none
            was = _described_version(opened.version) if isinstance(opened, StoredFile) else "absent"
            raise StoreChanged(self.where(path), f"{_described_version(file.version)} answered, {was} as opened")
        self._count(file, start, start + len(data), data)
        return file, data

    def _known(self, path: str) -> StoredFile | None:
        """The version remembered for path; FileNotFoundError if it is remembered absent, or no object can
        have that name."""
        if not is_key(path):
            raise FileNotFoundError(errno.ENOENT, "not a name an object can have", self.where(path))
        with self._lock:  # cachetools' LRU reorders itself on get: not safe to share unlocked
            found = self._opened.get(path)
        if isinstance(found, Absent):
            raise self._absent(path)
        return found

    def _absent(self, path: str) -> FileNotFoundError:
        """A new error each time: one raised again keeps every traceback it was raised with, and their frames."""
        return FileNotFoundError(errno.ENOENT, "not in the source", self.where(path))

    def _remember(self, path: str, found: T) -> T | StoredFile | Absent:
        """Remember what path was found to be (a version, or absent); what was remembered first stays, and
        is returned."""
        with self._lock:
            remembered = self._opened.setdefault(path, found)
        if remembered is found and isinstance(remembered, StoredFile) and remembered.version[0] == "size":
            self._say_unversioned(remembered.path)
        return remembered

    def _file(self, path: str, meta: Any) -> StoredFile:
        return StoredFile(path, meta["size"], _version(meta), self._owner, self)

    def read(self, file: StoredFile, start: int, stop: int, request: Request = OWN) -> bytes:
        """Bytes [start, stop) of file's version, from --cache-dir if kept there (never for a version that
        is only a size: another object of that size would be answered)."""
        disk = self._disk(file)
        if disk is not None:
            cached = disk.get(self.where(file.path), file.version, start, stop)
            self.context.metrics.disk_cache.labels("miss" if cached is None else "hit").inc()
            if cached is not None:
                return cached
        data = self._call("get", file.path, lambda: self._get(file, start, stop), request)
        self._count(file, start, stop, data)
        return data

    def _disk(self, file: StoredFile) -> DiskCache | None:
        return self.disk if file.version[0] != "size" else None

    def _count(self, file: StoredFile, start: int, stop: int, data: bytes) -> None:
        """A range read from the source: counted, and kept in --cache-dir if its version allows."""
        self.context.metrics.store_reads.inc()
        self.context.metrics.store_bytes.inc(len(data))
        if (disk := self._disk(file)) is not None:
            disk.put(self.where(file.path), file.version, start, stop, data)

    def _get(self, file: StoredFile, start: int, stop: int) -> bytes:
        """One GET of a range under the version's precondition, its answer checked against that version."""
        url = self.where(file.path)
        options: dict[str, Any] = {"range": (start, stop), **_precondition(file.version)}
        try:
            got = obstore.get(self._store(), file.path, options=options)
        except FileNotFoundError:
            raise StoreChanged(url, "deleted since it was opened") from None
        except PreconditionError:
            raise StoreChanged(url, f"the server refused {_described(file.version)}: replaced since opened") from None
        if (differs := _differs(file, got.meta)) is not None:
            raise StoreChanged(url, differs)
        return _body(url, got, start, stop)

    def _get_first(self, path: str, start: int, stop: int) -> tuple[StoredFile, bytes, int]:
        """One GET of a range with no precondition: the version is what its answer says. obstore checks
        that a ranged answer is partial content for the range asked, clipped to the total it names."""
        got = obstore.get(self._store(), path, options={"range": (start, stop)})
        file = self._file(path, got.meta)
        return file, _body(self.where(path), got, start, min(stop, file.size)), start

    def _get_tail(self, path: str, n: int) -> tuple[StoredFile, bytes, int]:
        """One GET of the last n bytes with no precondition, as _get_first (obstore checks that the answer is
        the tail of the total it names); NoSuffixRanges if the server answered anything but partial content
        (obstore refuses it unread)."""
        try:
            got = obstore.get(self._store(), path, options={"range": {"suffix": n}})
        except NotSupportedError:
            raise NoSuffixRanges from None
        file = self._file(path, got.meta)
        start = max(file.size - n, 0)
        return file, _body(self.where(path), got, start, file.size), start

    def _refuse_suffixes(self) -> None:
        """Once per source: a server without suffix ranges costs a HEAD before each shard index at the end."""
        with self._lock:
            said, self._suffixes = not self._suffixes, False
        if not said:
            log.warning(
                "%s: the server does not answer suffix ranges (bytes=-N): each shard whose index is at its end "
                "costs a HEAD first", self.remote.url, extra={"event": "no_suffix_ranges"},
            )  # fmt: skip

    def _say_unversioned(self, path: str) -> None:
        """Once per source: what a server that names no version costs."""
        with self._lock:
            said, self._said_unversioned = self._said_unversioned, True
        if not said:
            uncached = "; nothing from it is kept in --cache-dir" if self.disk is not None else ""
            log.warning(
                "%s: the server sends neither ETag nor Last-Modified (%s): an object replaced under the mount is "
                "noticed only if its size changed%s", self.remote.url, path, uncached, extra={"event": "unversioned"},
            )  # fmt: skip

    def next_data(self, file: StoredFile, offset: int) -> int:
        return offset  # an object has no holes that can be asked about

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        """A directory's entries, from one bounded walk (`Walk`) of the keys below it, in the server's order:
        its objects, and each subdirectory once. A subdirectory's keys are read past while they fit in a page;
        past a page of them, a request that starts after them skips the rest (object_store's delimited
        listing gathers every page before it answers, so it cannot be bounded)."""
        if not self.can_list or not is_key(path):
            return
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        walk, offset, said = Walk(self, path, "list"), None, [""]
        while True:
            offset = yield from self._listed_until(walk, prefix, offset, said)
            if offset is None:
                return

    def _listed_until(self, walk: Walk, prefix: str, offset: str | None, said: list[str]) -> Listed:
        """The entries from offset on, each subdirectory once (said: the last one listed); returns the offset
        that skips the rest of a subdirectory whose keys fill a page, or None at the end (of the listing, or
        of the walk's bounds)."""
        run = 0  # keys of the subdirectory said[0] read in a row
        for page in walk.pages(prefix or None, offset):
            for meta in page:
                name, slash, _ = meta["path"][len(prefix) :].partition("/")
                if not slash:
                    yield name, False
                    continue
                if name != said[0]:  # a server that lists a subdirectory again costs requests, not names
                    said[0], run = name, 0
                    yield name, True
                run += 1
                if run >= walk.page:
                    return f"{prefix}{name}/{SKIP}"
        return None

    def type_of(self, path: str) -> str | None:
        if not path.strip("/"):
            return "dir"
        if self.is_file(path):
            return "file"
        if not self.can_list or not is_key(path):
            return None
        walk = Walk(self, path, "list", page=1, seconds=self.access.timeout)  # a lookup waits one request's time
        return "dir" if any(walk.pages(f"{path.strip('/')}/", None)) else None

    def is_file(self, path: str) -> bool:
        """One HEAD (none if remembered): an object of that name. A prefix of that name is none."""
        if not path.strip("/"):
            return False
        try:
            self.open(path)
            return True
        except FileNotFoundError:
            return False

    def owner(self, path: str) -> Owner:
        return self._owner

    def where(self, path: str) -> str:
        return self.remote.url_of(path)

    def forget(self) -> None:
        with self._lock:
            self._opened.clear()

    def descriptors(self) -> list[int]:
        return []

    def sizes(self) -> Iterator[int]:
        """Every object's size under the source's prefix, a listing page at a time, within one walk's bounds;
        nothing over HTTP."""
        if not self.can_list:
            return
        for page in Walk(self, "", "list").pages(None, None):
            for meta in page:
                yield meta["size"]


class Walk:
    """The bounds of one paginated listing: LISTING_REQUESTS requests, LISTING_BYTES bytes of names and
    LISTING_TIMEOUTS times --timeout, whichever comes first. Its pages end at the first bound reached, which
    is logged once, so that a listing answers with what it found."""

    def __init__(
        self, store: RemoteStore, path: str, what: str, page: int = LISTING_PAGE, seconds: float | None = None
    ) -> None:
        self.store, self.path, self.what, self.page = store, path, what, page
        self.started = time.monotonic()
        self.seconds = LISTING_TIMEOUTS * store.access.timeout if seconds is None else seconds
        self.requests = self.nbytes = 0
        self._said = False

    def pages(self, prefix: str | None, offset: str | None) -> Iterator[list[dict[str, Any]]]:
        """The objects below prefix after offset, a page at a time. Each page is awaited with the time left:
        pages that come empty forever end at the deadline as any other, the request under way abandoned
        (obstore drops it when its future is cancelled)."""
        if self.ended():
            return
        loop = asyncio.new_event_loop()
        stream = obstore.list(self.store._store(), prefix, offset=offset, chunk_size=self.page)

        async def step() -> list[dict[str, Any]] | None:
            try:
                return await asyncio.wait_for(anext(stream), max(self.started + self.seconds - time.monotonic(), 0))
            except StopAsyncIteration:
                return None
            except TimeoutError:
                return []  # the deadline: ended() says so

        try:
            while not self.ended():
                page = self.store._call(self.what, self.path, lambda: loop.run_until_complete(step()))
                if page is None:
                    return
                self.requests += 1
                self.nbytes += sum(len(meta["path"]) for meta in page)
                yield page
        finally:
            if not loop.is_running():  # else Ctrl-C left it to a request thread that ends with the process
                loop.close()

    def ended(self) -> bool:
        """Whether a bound is reached; logged the first time."""
        took = time.monotonic() - self.started
        if self.requests < LISTING_REQUESTS and self.nbytes < LISTING_BYTES and took < self.seconds:
            return False
        if not self._said:
            self._said = True
            log.warning(
                "%s: a listing stops after %d requests, %d bytes of names and %.0f s (at most %d, %d and %.0f s): it "
                "shows what it found", self.store.where(self.path), self.requests, self.nbytes, took, LISTING_REQUESTS,
                LISTING_BYTES, self.seconds, extra={"event": "listing_bound", "path": self.path},
            )  # fmt: skip
        return True


class NoBucket(OSError):
    """The source's bucket does not exist (S3's NoSuchBucket, which GCS says too): EIO, since a whole source is
    missing, not one object, and said in those words rather than the request's internals."""

    def __init__(self, remote: Remote, access: Access, path: str) -> None:
        where = access.endpoint or CLOUDS[remote.scheme]
        super().__init__(errno.EIO, f"bucket {remote.bucket!r} does not exist (at {where})", path)


class NoSuffixRanges(Exception):
    """The server answered a suffix range (`bytes=-N`) with something other than partial content."""


class BadAnswer(OSError):
    """A server's answer that is not the range asked for: longer, shorter, or re-encoded. The read is EIO."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EIO, f"refused the server's answer ({why})", path)


# object_store takes a path only as UTF-8 text without ASCII control characters; it refuses others unsent.
_NOT_IN_A_KEY = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
# object_store's stand-in for a Last-Modified header the server did not send.
_NO_DATE = datetime(1970, 1, 1, tzinfo=UTC)


def is_key(path: str) -> bool:
    """Whether path can name an object; a name that cannot (a lone surrogate is a non-UTF-8 byte of a
    name the kernel sent) names nothing there: absent, not an error."""
    return _NOT_IN_A_KEY.search(path) is None


def _version(meta: Any) -> tuple:
    """An object's version: its ETag, else its size and Last-Modified date, else its size alone."""
    if meta.get("e_tag"):
        return ("etag", meta["e_tag"])
    if (when := _modified(meta)) is not None:
        return ("modified", meta["size"], when)
    return ("size", meta["size"])


def _modified(meta: Any) -> str | None:
    when = meta.get("last_modified")
    return None if when is None or when == _NO_DATE else when.isoformat()


def _precondition(version: tuple) -> dict[str, Any]:
    """The strongest GET precondition a version allows. A size allows none, nor does a weak ETag: If-Match
    compares strongly, so a server keeping RFC 9110 would refuse every read (the answer's ETag is compared)."""
    if version[0] == "etag":
        return {} if version[1].startswith("W/") else {"if_match": version[1]}
    if version[0] == "modified":
        return {"if_unmodified_since": datetime.fromisoformat(version[2])}
    return {}


def _described_version(version: tuple) -> str:
    return {"etag": "ETag", "modified": "Last-Modified", "size": "size"}[version[0]] + f" {version[-1]}"


def _described(version: tuple) -> str:
    if version[0] == "etag":
        return f"If-Match {version[1]}"
    return f"If-Unmodified-Since {version[2]}"


def _differs(file: StoredFile, meta: Any) -> str | None:
    """Which field of an answer names another version than file's, if any."""
    if meta["size"] != file.size:
        return f"size {meta['size']}, not {file.size} as opened"
    if file.version[0] == "etag" and meta.get("e_tag") != file.version[1]:
        return f"ETag {meta.get('e_tag')}, not {file.version[1]} as opened"
    if file.version[0] == "modified" and _modified(meta) != file.version[2]:
        return f"Last-Modified {_modified(meta)}, not {file.version[2]} as opened"
    return None


def _body(url: str, got: Any, start: int, stop: int) -> bytes:
    """An answer's body, read no further than one byte past the length asked. obstore gathers a stream's
    chunks to at least min_chunk_size (all but the last), so a right answer is one chunk, a long one stops
    after one network read past the length, and no body costs more memory than its range."""
    asked = stop - start
    parts: list[bytes] = []
    n = 0
    for part in got.stream(min_chunk_size=asked + 1):
        parts.append(part)
        n += len(part)
        if n > asked:
            break
    if n != asked:
        raise BadAnswer(url, _wrong_length(got.attributes, start, asked, n))
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)  # bytes: callers slice, hash and size them


def _wrong_length(attributes: Any, start: int, asked: int, n: int) -> str:
    """Why an answer's body is not the asked length. (A Content-Encoding on an answer of the right length is
    the object's stored encoding, as S3 keeps it: its bytes are the stored bytes, and they are taken.)"""
    encoding = attributes.get("Content-Encoding")
    if encoding and encoding != "identity":
        return f"compressed by the server (Content-Encoding {encoding}), not the {asked} stored bytes at {start}"
    if n > asked:
        return f"the server sent more than the {asked} bytes asked at {start}: longer than asked"
    return f"{n} bytes at {start}, not {asked}: shorter than asked: truncated"


def _first_line(e: BaseException) -> str:
    """The library's message in one line; where the server's answer was an S3/GCS XML error (its first line
    only the XML declaration), with its code and message, which say what is wrong (NoSuchBucket)."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    first = text.splitlines()[0]
    if code := re.search(r"<Code>([^<]{1,100})</Code>", text):
        said = re.search(r"<Message>([^<]{1,300})</Message>", text)
        first = (
            re.sub(r":?\s*<\?xml[^>]*\?>$", "", first) + f": {code.group(1)}" + (f" ({said.group(1)})" if said else "")
        )
    return first
