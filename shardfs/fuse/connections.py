"""A FUSE connection seen from fusectl (`/sys/fs/fuse/connections/N`): the kernel's side of a connection beyond
its device, where one still held after its mount is gone (a reader stuck on a hung daemon holds it for ever) is
aborted. Whoever takes mounts down (the host's publisher) asks here; where fusectl is, is theirs to say."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from pathlib import Path

FUSECTL = Path("/sys/fs/fuse/connections")


def mount_fusectl(at: Path) -> None:
    """A fusectl mount of this process's own at `at` (as in most containers, where the host's is not mounted)."""
    at.mkdir(parents=True, exist_ok=True)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.mount(b"fusectl", os.fsencode(at), b"fusectl", 0, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot mount fusectl at {at}: {os.strerror(code)}")


def device_connection(device: str) -> int | None:
    """A FUSE mount's connection number: the minor of its device, `0:N`, as mountinfo lists it."""
    major, _, minor = device.partition(":")
    return int(minor) if major == "0" and minor.isdigit() else None


def opened(fusectl: Path, connection: int | None, still: Callable[[], int | None]) -> int | None:
    """The connection's fusectl directory, opened while still() says its mount has that number. The kernel gives
    an ended connection's number to the next mount made anywhere, so a later look by number could find (and
    abort) another one; through this descriptor, the directory is gone once its connection is. None if the
    connection is gone, or was never known."""
    if connection is None:
        return None
    try:
        held = os.open(fusectl / str(connection), os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    if still() != connection:  # it ended before the directory was opened: not ours
        os.close(held)
        return None
    return held


def abort_if_held(directory: int, wait: float) -> bool:
    """Abort the connection of an opened() directory if it is still there after wait seconds (its mount was
    detached: an unanswered reader is all that can hold it); whether it was aborted. Closes directory."""
    try:
        deadline = time.monotonic() + wait
        while _exists("abort", directory) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            abort = os.open("abort", os.O_WRONLY, dir_fd=directory)
        except FileNotFoundError:  # gone by itself meanwhile
            return False
        with open(abort, "w") as f:
            f.write("1")
        return True
    finally:
        with contextlib.suppress(OSError):
            os.close(directory)


def _exists(name: str, directory: int) -> bool:
    try:
        os.stat(name, dir_fd=directory)
    except FileNotFoundError:
        return False
    return True
