"""`--cache-dir`: byte ranges of remote objects kept on local disk across mounts, bounded in bytes.

An entry is named by a hash of the object's URL, its version (ETag) and the range, so a replaced object
is never answered from the disk: its new version has other names, and the old ones age out.

Nothing in the directory is trusted that the daemon did not write and check itself. The directory must be
the mounting user's and writable by nobody else; it is opened once, and every entry is opened, made and
renamed relative to that descriptor, so what becomes of its path later changes nothing. An entry is read
only if it is a regular file of this user (never through a link, never blocking on a FIFO) of exactly the
expected size, and its bytes are served only if its header names this very range and its checksum holds:
anything else is deleted and fetched from the source again. A cache that cannot be written costs the
cache, never the read.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import stat
import struct
import threading
import time
from pathlib import Path

from shardfs.codecs import crc32c
from shardfs.errors import CacheDirRefused

log = logging.getLogger("shardfs")

EVICT_TO = 0.9  # of the budget, after an eviction: so the next few writes do not evict again
MAGIC = b"shardfs-range-1\n"
HEADER = struct.Struct("<16s32sQI")  # MAGIC, the entry's key (sha256), the range's length, crc32c of the range
ENTRY = re.compile(r"[0-9a-f]{64}")  # the only names the cache reads, counts or deletes
PART = ".part-"  # an entry being written, renamed to its name once whole
PART_STALE = 600  # seconds: a part this old was left by a daemon that died writing it (a write takes ms)


class DamagedEntry(Exception):
    """An entry that is not what this cache wrote for its name: deleted, and counted as a miss."""


class DiskCache:
    """Ranges as files in one directory, at most budget bytes of them; least recently used go first. The
    count of bytes held is kept in memory and made exact again by every eviction's scan."""

    def __init__(self, directory: Path, budget: int) -> None:
        """Refuses (CacheDirRefused) a directory that is not this user's alone; makes it, 0700, if missing."""
        self.directory = directory
        self.budget = budget
        self._fd = open_own_dir(directory)
        self._lock = threading.Lock()
        self._warned = False
        self._clear_stale_parts()
        self._bytes = sum(size for _, size, _ in self._entries())

    def descriptors(self) -> list[int]:
        """The directory's descriptor, which the daemon keeps open when it detaches."""
        return [self._fd]

    def get(self, url: str, version: tuple, start: int, stop: int) -> bytes | None:
        """The range's bytes as kept, or None: missing, or damaged (then deleted)."""
        key = _key(url, version, start, stop)
        try:
            data = self._read(key, stop - start)
        except FileNotFoundError:
            data = None
        except (OSError, DamagedEntry) as e:  # a link, a FIFO, someone else's file, a flipped byte
            log.warning(
                "--cache-dir %s: entry %s for %s at %d-%d is damaged (%s); deleted, read from the source again",
                *(self.directory, key.hex(), url, start, stop, _reason(e)),
                extra={"event": "cache_entry_damaged"},
            )
            with contextlib.suppress(OSError):
                os.unlink(key.hex(), dir_fd=self._fd)
            data = None
        return data

    def _read(self, key: bytes, length: int) -> bytes:
        """The entry's range, checked; never more than its expected size is read."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(key.hex(), flags, dir_fd=self._fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise DamagedEntry("not a regular file of this user")
            if st.st_size != HEADER.size + length:
                raise DamagedEntry(f"{st.st_size} bytes, not {HEADER.size + length}")
            header, data = os.pread(fd, HEADER.size, 0), os.pread(fd, length, HEADER.size)
            if len(header) + len(data) != HEADER.size + length:
                raise DamagedEntry("shorter than it was")
            if HEADER.unpack(header) != (MAGIC, key, length, crc32c(data)):
                raise DamagedEntry("header or checksum does not match")
            with contextlib.suppress(OSError):
                _touch(fd)  # recently used: evicted last
            return data
        finally:
            os.close(fd)

    def put(self, url: str, version: tuple, start: int, stop: int, data: bytes) -> None:
        """Keep the range, if the directory will take it; a failure is logged once and otherwise ignored."""
        size = HEADER.size + len(data)
        if size > self.budget:
            return
        key = _key(url, version, start, stop)
        try:
            self._write(key.hex(), HEADER.pack(MAGIC, key, len(data), crc32c(data)), data)
        except OSError as e:  # a full or read-only disk costs the cache, never the read
            self._cannot_write(e)
            return
        with self._lock:
            self._bytes += size
            if self._bytes > self.budget:
                self._evict()

    def _write(self, name: str, header: bytes, data: bytes) -> None:
        """A new file of our own (never through a link), renamed into place once whole: a reader in
        another mount never sees half of it."""
        part = PART + secrets.token_hex(8)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(part, flags, 0o600, dir_fd=self._fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(data)
                f.flush()
                _touch(f.fileno())
            os.replace(part, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part, dir_fd=self._fd)
            raise

    def _cannot_write(self, e: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "--cache-dir %s: cannot write (%s); ranges are not kept while it lasts",
                *(self.directory, e.strerror or e),
                extra={"event": "cache_dir_unwritable"},
            )

    def _entries(self) -> list[tuple[int, int, str]]:
        """(last use, size, name) of every entry: names this cache makes, nothing else in the directory."""
        found = []
        with os.scandir(self._fd) as scan:  # shares the descriptor's offset: one scan at a time (the lock)
            for e in scan:
                with contextlib.suppress(OSError):
                    if ENTRY.fullmatch(e.name) and not e.is_dir(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        found.append((st.st_mtime_ns, st.st_size, e.name))
        return found

    def _clear_stale_parts(self) -> None:
        """Parts left by a daemon that died writing them: counted by no budget, so removed here."""
        stale = time.time_ns() - PART_STALE * 10**9
        with os.scandir(self._fd) as scan:
            for e in scan:
                with contextlib.suppress(OSError):
                    if e.name.startswith(PART) and e.stat(follow_symlinks=False).st_mtime_ns < stale:
                        os.unlink(e.name, dir_fd=self._fd)

    def _evict(self) -> None:
        """Least recently used first, until EVICT_TO of the budget is held."""
        entries = self._entries()
        held = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if held <= self.budget * EVICT_TO:
                break
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._fd)
                held -= size
        self._bytes = held


def open_own_dir(directory: Path) -> int:
    """A descriptor of directory, made 0700 if missing; refused unless it is a real directory of this user
    that nobody else can write to (else they could swap an entry for a link, a FIFO or other bytes)."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise CacheDirRefused(f"--cache-dir {directory}: {_not_opened(directory, e)}") from None
    st = os.fstat(fd)
    why = None
    if st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}); name a directory of your own"
    elif st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        why = f"writable by other users (mode {mode:04o}); run `chmod go-w {directory}` or name another directory"
    if why is not None:
        os.close(fd)
        raise CacheDirRefused(f"--cache-dir {directory}: {why}")
    return fd


def _not_opened(directory: Path, e: OSError) -> str:
    if os.path.islink(directory):
        return "is a symbolic link; name the directory it points to"
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        return "not a directory; name a directory (it is made if missing)"
    return f"cannot be opened ({e.strerror or e})"


def _key(url: str, version: tuple, start: int, stop: int) -> bytes:
    return hashlib.sha256(repr((url, version, start, stop)).encode()).digest()


def _touch(fd: int) -> None:
    """Last use, to the nanosecond: the kernel's own timestamps tick only every few milliseconds, too coarse
    to order a burst of writes for eviction."""
    now = time.time_ns()
    os.utime(fd, ns=(now, now))


def _reason(e: Exception) -> str:
    return (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
