"""Byte ranges from an object store or a web server (gs://, s3://, http(s)://), through obstore.

One obstore client per daemon process, shared by every libfuse thread: obstore releases the GIL, keeps
connections alive, and retries 429, 5xx and timeouts with backoff, all within one deadline per request.
Every answer becomes what a local disk would say: a missing object is ENOENT, a refusal EACCES, anything
the retries could not get past EIO (never ENOENT: a server error must not look like an absent chunk).
Every read names the version (ETag) it was opened at, so an index never meets bytes of another version.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import obstore
from cachetools import LRUCache
from obstore.exceptions import PermissionDeniedError, PreconditionError, UnauthenticatedError
from obstore.store import GCSStore, HTTPStore, S3Store

from shardfs import credentials, metrics
from shardfs.disk_cache import DiskCache
from shardfs.errors import SourceError
from shardfs.location import Remote
from shardfs.store import Owner, StoreChanged, StoredFile

log = logging.getLogger("shardfs")

DEFAULT_TIMEOUT = 30.0
OPENED = 65536  # objects whose size and version are remembered: a few MB, and a shard is opened once
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Access:
    """How to reach a remote source: --anonymous, --endpoint, --region, --timeout."""

    anonymous: bool = False
    endpoint: str | None = None
    region: str | None = None
    timeout: float = DEFAULT_TIMEOUT


def client_options(access: Access, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Timeouts and retries that keep a request, retries included, within access.timeout: each attempt
    gets a quarter of it, retries stop being started after half of it, and no backoff waits longer than
    an eighth."""
    t = access.timeout
    options = {
        "timeout": timedelta(seconds=t / 4),
        "connect_timeout": timedelta(seconds=t / 4),
        "allow_http": url.startswith("http://"),
    }
    retry = {
        "max_retries": 10,
        "retry_timeout": timedelta(seconds=t / 2),
        "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=t / 8), "base": 2},
    }
    return options, retry


def make_client(remote: Remote, access: Access) -> Any:
    """The obstore store for a remote source; unsigned when asked or when no credentials are found (see
    shardfs/credentials.py for where they are looked for)."""
    endpoint = access.endpoint or ""
    options, retry = client_options(access, endpoint or remote.url)
    common: dict[str, Any] = {"client_options": options, "retry_config": retry}
    if remote.scheme in ("http", "https"):
        if remote.authorization:  # the URL's user:password; reqwest drops it on a redirect to another host
            options["default_headers"] = {"authorization": remote.authorization}
        return HTTPStore(remote.address, **common)
    prefix = remote.prefix or None
    if remote.scheme == "s3":
        provider = None if access.anonymous else credentials.aws(remote.url)
        config: dict[str, Any] = {"skip_signature": provider is None}
        if endpoint:
            config["endpoint"] = endpoint
        if access.region:
            config["region"] = access.region  # else the profile's, or AWS_DEFAULT_REGION, or us-east-1
        _say_unsigned(remote, access, provider is not None)
        return S3Store(remote.bucket, prefix=prefix, config=config, credential_provider=provider, **common)
    signed = not access.anonymous and credentials.gcs(remote.url)
    config = {"skip_signature": not signed}
    if endpoint:
        config["base_url"] = endpoint
    _say_unsigned(remote, access, signed)
    return GCSStore(remote.bucket, prefix=prefix, config=config, **common)


def _say_unsigned(remote: Remote, access: Access, signed: bool) -> None:
    if not signed and not access.anonymous:
        log.info("%s: no credentials found; requests are sent unsigned", remote.url, extra={"event": "unsigned"})


class RemoteStore:
    """The Store protocol over obstore. Objects have no owner: everything is shown as the daemon's user's,
    readable by all. A directory is a key prefix; HTTP servers cannot list, so there a directory lists
    as empty and only what metadata names is found."""

    def __init__(self, remote: Remote, access: Access, disk: DiskCache | None = None) -> None:
        """disk: where byte ranges are kept across mounts (--cache-dir), if anywhere."""
        self.remote, self.access, self.disk = remote, access, disk
        self.can_list = remote.scheme in ("gs", "s3")
        self.piece_size = 8 << 20  # one GET for nearly every chunk, yet a bounded part of a large one
        self._owner = Owner(os.getuid(), os.getgid(), 0o555)
        self._lock = threading.Lock()
        self._client: tuple[int, Any] | None = None
        self._opened: LRUCache[str, StoredFile | FileNotFoundError] = LRUCache(OPENED)

    def _store(self) -> Any:
        """The client of this process: obstore's runtime threads do not survive the daemon's fork, so a
        client is made where it is used, once."""
        made = self._client
        if made is None or made[0] != os.getpid():
            with self._lock:
                made = self._client
                if made is None or made[0] != os.getpid():
                    made = self._client = (os.getpid(), make_client(self.remote, self.access))
        return made[1]

    def _call(self, what: str, path: str, request: Callable[[], T]) -> T:
        """One request (retries included), counted and timed; obstore's errors as a disk's errno."""
        started = time.monotonic()
        outcome = "ok"
        try:
            return request()
        except FileNotFoundError:
            outcome = "not_found"
            raise FileNotFoundError(errno.ENOENT, "not in the source", self.where(path)) from None
        except PreconditionError:
            outcome = "changed"
            raise StoreChanged(self.where(path), "replaced since its index was read") from None
        except (PermissionDeniedError, UnauthenticatedError) as e:
            outcome = "denied"
            log.error("%s: access denied: %s", self.where(path), _first_line(e), extra={"event": "remote_denied"})
            raise PermissionError(errno.EACCES, "access denied by the server", self.where(path)) from None
        except SourceError:  # no client could be made (credentials): the mount's reason, not the server's
            outcome = "refused"
            raise
        except Exception as e:  # 5xx and timeouts once retries are spent, refused connections, bad answers
            outcome = "failed"
            log.error("%s: %s failed: %s", self.where(path), what, _first_line(e), extra={"event": "remote_failed"})
            raise OSError(errno.EIO, f"{what} failed: {_first_line(e)}", self.where(path)) from None
        finally:
            metrics.REMOTE_REQUESTS.labels(what, outcome).inc()
            metrics.REMOTE_SECONDS.labels(what).observe(time.monotonic() - started)

    # -- the Store protocol -------------------------------------------------------------------------------------------

    def open(self, path: str) -> StoredFile:
        """The object's size and version, from one HEAD, remembered (absence too): the data is immutable
        while mounted, and a shard's size is needed by every read of it."""
        with self._lock:  # cachetools' LRU reorders itself on get: not safe to share unlocked
            found = self._opened.get(path)
        if found is None:
            try:
                meta = self._call("head", path, lambda: obstore.head(self._store(), path))
                found = StoredFile(path, meta["size"], _version(meta), self._owner, self)
            except FileNotFoundError as e:
                found = e
            with self._lock:
                self._opened[path] = found
        if isinstance(found, FileNotFoundError):
            raise found
        return found

    def read(self, file: StoredFile, start: int, stop: int) -> bytes:
        url = self.where(file.path)
        if self.disk is not None and (kept := self.disk.get(url, file.version, start, stop)) is not None:
            return kept
        options: dict[str, Any] = {"range": (start, stop)}
        if file.version[0] == "etag":
            options["if_match"] = file.version[1]

        def get() -> bytes:
            return bytes(obstore.get(self._store(), file.path, options=options).bytes())

        try:
            data = self._call("get", file.path, get)
        except FileNotFoundError:
            raise StoreChanged(self.where(file.path), "deleted since it was opened") from None
        metrics.STORE_READS.inc()
        metrics.STORE_BYTES.inc(len(data))
        if len(data) != stop - start:
            raise StoreChanged(url, f"{len(data)} bytes at {start}, not {stop - start}: truncated")
        if self.disk is not None:
            self.disk.put(url, file.version, start, stop, data)
        return data

    def next_data(self, file: StoredFile, offset: int) -> int:
        return offset  # an object has no holes that can be asked about

    def list(self, path: str) -> Iterator[tuple[str, bool]]:
        """A directory's entries, one delimited listing of its prefix."""
        if not self.can_list:
            return
        prefix = f"{path.strip('/')}/" if path.strip("/") else None
        found = self._call("list", path, lambda: obstore.list_with_delimiter(self._store(), prefix))
        for sub in found["common_prefixes"]:
            yield sub.rstrip("/").rpartition("/")[2], True
        for meta in found["objects"]:
            yield meta["path"].rpartition("/")[2], False

    def kind(self, path: str) -> str | None:
        if not path.strip("/"):
            return "dir"
        try:
            self.open(path)
            return "file"
        except FileNotFoundError:
            pass
        if not self.can_list:
            return None
        prefix = f"{path.strip('/')}/"
        first = self._call("list", path, lambda: next(iter(obstore.list(self._store(), prefix, chunk_size=1)), []))
        return "dir" if first else None

    def owner(self, path: str) -> Owner:
        return self._owner

    def where(self, path: str) -> str:
        return self.remote.url_of(path)

    def forget(self) -> None:
        with self._lock:
            self._opened.clear()

    def descriptors(self) -> list[int]:
        return []


def _version(meta: Any) -> tuple:
    """An object's version: its ETag, else its size and modification time."""
    if meta.get("e_tag"):
        return ("etag", meta["e_tag"])
    return ("modified", meta["size"], str(meta.get("last_modified")))


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
