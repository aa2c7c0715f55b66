"""The harness of the in-process fuzz tests (tests/hostile/test_fuzz.py, tests/hostile/test_view_axes.py): each
operation on a Tree under a wall-clock bound, its outcome as FUSE would answer it (bytes, ENOENT or EIO), and a walk
of every name a source serves."""

from __future__ import annotations

import errno
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from hypothesis import HealthCheck, settings

from shardfs.errors import CorruptChunk, SourceError
from shardfs.files import Dir
from shardfs.source import Source, open_source
from shardfs.tree import Tree

T = TypeVar("T")


CACHE_BYTES = 4 << 20  # small, so that eviction and re-reading are exercised as well


OP_SECONDS = 30.0  # wall-clock ceiling on one lookup, read or whole listing: work without bound, not slowness


MAX_ENTRIES = 20_000  # a listing longer than this is cut short (metadata fuzz can make huge grids)


READ_CAP = 64 << 20  # bytes read of one file at most


# Reproducible in CI: the same examples every run, no example database.
FUZZ = settings(
    derandomize=True,
    database=None,
    # Per example, which is a few hundred operations; each operation has its own, harder, bound (Hang below).
    deadline=timedelta(seconds=10),
    print_blob=False,
    # Each example opens a source and reads all of it: slow by Hypothesis' standards, by design.
    suppress_health_check=[HealthCheck.too_slow],
)


class Hang(BaseException):
    """An operation passed its wall-clock bound. A BaseException, so that no `except Exception` in shardfs
    can swallow it."""


@dataclass(frozen=True)
class Failed:
    """An operation that failed in a way FUSE maps to an errno."""

    errno: int


ENOENT = Failed(errno.ENOENT)


EIO = Failed(errno.EIO)


IS_DIR = Failed(errno.EISDIR)  # a directory where a file was asked for: never right for a chunk


def _alarm(signum: int, frame: object) -> None:
    raise Hang(f"operation exceeded {OP_SECONDS} s")


def attempt(what: str, op: Callable[[], T]) -> T | Failed:
    """Run op under the wall-clock bound; map its exception as fs/bridge.py does. ENOENT and EIO are the only
    errnos corrupt data may give; any other exception propagates and fails the test."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, OP_SECONDS)
    started = time.monotonic()
    try:
        outcome = _outcome(what, op)
    except Hang:
        raise Hang(f"{what}: still running after {OP_SECONDS} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started <= OP_SECONDS, f"{what}: took {time.monotonic() - started:.2f} s"
    return outcome


def _outcome(what: str, op: Callable[[], T]) -> T | Failed:
    try:
        return op()
    except (FileNotFoundError, NotADirectoryError):
        return ENOENT
    except CorruptChunk:
        return EIO
    except OSError as e:
        assert e.errno in (errno.ENOENT, errno.EIO), f"{what}: unexpected {e!r}"
        return Failed(e.errno)


def read_file(tree: Tree, path: str) -> bytes | Failed:
    """lookup + size + read, as `cat` does through FUSE: the bytes must be exactly size() long."""

    def op() -> bytes | Failed:
        node = tree.lookup(path)
        if isinstance(node, Dir):
            return IS_DIR
        size = node.size()
        assert size >= 0, f"{path}: size {size}"
        data = node.read(0, min(size, READ_CAP))
        assert len(data) == min(size, READ_CAP), f"{path}: read {len(data)} bytes of a {size}-byte file"
        if size > 8:  # a read at an offset agrees with the whole
            assert node.read(size // 2, 8) == data[size // 2 : size // 2 + 8], f"{path}: reads disagree"
        return data

    return attempt(f"read {path!r}", op)


def walk(tree: Tree, dirs: set[str] | None = None) -> dict[str, bytes | Failed]:
    """listdir of every directory, and lookup + read of every name listed: what `find | xargs cat` does.
    The directories found are added to dirs."""
    seen: dict[str, bytes | Failed] = {}
    dirs = {""} if dirs is None else dirs
    dirs.add("")
    stack = [""]
    while stack and len(seen) < MAX_ENTRIES:
        directory = stack.pop()

        def entries(directory: str = directory) -> list[tuple[str, bool]]:
            out = []
            for name, is_dir in tree.listdir(directory):
                assert name and "/" not in name and name not in (".", ".."), f"listed name {name!r}"
                out.append((name, is_dir))
                if len(out) >= MAX_ENTRIES:
                    break
            return out

        listed = attempt(f"listdir {directory!r}", entries)
        if isinstance(listed, Failed):
            continue
        for name, is_dir in listed:
            path = f"{directory}/{name}" if directory else name
            if is_dir:
                node = attempt(f"lookup {path!r}", lambda path=path: tree.lookup(path))
                if isinstance(node, Dir) and path not in dirs and path.count("/") < 16:
                    dirs.add(path)
                    stack.append(path)
            else:
                seen[path] = read_file(tree, path)
                assert seen[path] != IS_DIR, f"{path}: listed as a file, looked up as a directory"
    return seen


def open_or_refuse(root: Path, view: str, culprit: Path | None = None) -> Source | None:
    """open_source under the time bound: a source, or None if refused in one line naming a file (the culprit,
    if known)."""
    try:
        source = attempt("open", lambda: open_source(root, CACHE_BYTES, view))
    except SourceError as e:
        message = str(e)
        assert "\n" not in message.strip(), f"refusal in more than one line: {e}"
        if culprit is not None and culprit.name == "info":  # a view's refusal names the source, not a file
            assert str(culprit) in message or view != "native", f"refusal does not name {culprit}: {e}"
        assert str(root) in message, f"refusal names no file of the source: {e}"
        return None
    assert not isinstance(source, Failed), f"open gave {source}"
    return source
