"""A tree mounted and served by shardfs's own session, with the `-o` options the daemon always took.

Options become mount(2) data, kernel timeouts or session settings; an option that means nothing here
refuses the mount in one line, as libfuse did. SIGTERM and SIGINT unmount (lazily, as libfuse does).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shardfs.fuse.adapter import TreeOps
from shardfs.fuse.mount import VFS_FLAGS, FuseMountError, MountOptions, handed_fd, mount, unmount
from shardfs.fuse.session import Session, Timeouts
from shardfs.tree import Tree

DEFAULT_THREADS = 10  # max_threads when not given, as libfuse had it
IGNORED = frozenset({"max_idle_threads"})  # libfuse's; every thread here waits on the device, none idles


@dataclass(frozen=True)
class Settings:
    mount: MountOptions
    timeouts: Timeouts
    threads: int
    kernel_cache: bool


def settings_of(options: dict[str, str | bool], mountpoint: Path) -> Settings:
    """What `-o` options (as daemon.fuse_options makes them) ask of the mount and the session."""
    left = {k: v for k, v in options.items() if k not in IGNORED}

    def flag(name: str) -> bool:
        return bool(left.pop(name, False))

    def number(name: str, default: float) -> float:
        value = left.pop(name, None)
        try:
            return default if value is None else float(value)
        except ValueError:
            raise FuseMountError(f"{mountpoint}: mount failed: invalid value {name}={value}") from None

    mount_options = MountOptions(
        fsname=str(left.pop("fsname", "shardfs")),
        subtype=str(left.pop("subtype", "shardfs")),
        read_only=flag("ro") or not flag("rw"),
        allow_other=flag("allow_other"),
        default_permissions=flag("default_permissions"),
        vfs=tuple(name for name in list(left) if name in VFS_FLAGS and left.pop(name)),
    )
    timeouts = Timeouts(number("entry_timeout", 1.0), number("attr_timeout", 1.0), number("negative_timeout", 0.0))
    threads = int(number("max_threads", DEFAULT_THREADS))
    kernel_cache = flag("kernel_cache")
    if left:
        names = ",".join(k if v is True else f"{k}={v}" for k, v in left.items())
        raise FuseMountError(f"{mountpoint}: mount failed: unknown option(s): `-o {names}'")
    if threads < 1:
        raise FuseMountError(f"{mountpoint}: mount failed: invalid value max_threads={threads}")
    return Settings(mount_options, timeouts, threads, kernel_cache)


def serve(
    tree: Tree, mtime_ns: int, mountpoint: Path, options: dict[str, str | bool], on_ready: Callable[[str], None]
) -> None:
    """Mount and serve until unmounted, SIGTERM or SIGINT; FuseMountError if the mount cannot be made.
    on_ready is told what the kernel granted, once the mount answers."""
    settings = settings_of(options, mountpoint)
    fd = mount(mountpoint, settings.mount)

    def ready() -> None:
        on_ready(session.granted_text())

    session = Session(fd, TreeOps(tree, mtime_ns), settings.threads, settings.timeouts, settings.kernel_cache, ready)

    def stop(signum: int, frame: object) -> None:
        if handed_fd(mountpoint) is None:  # a handed descriptor's mount is its parent's to end
            with contextlib.suppress(OSError, FuseMountError):
                unmount(mountpoint, lazy=True)
        session.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        session.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if session.ended:  # else a thread still reads it: the number must not name another file meanwhile
            os.close(fd)
