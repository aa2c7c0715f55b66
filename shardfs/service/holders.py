"""Who keeps a mount busy, as `fuser -m` would name them: for `shardfs unmount` refused with EBUSY, so the
user learns what to close instead of guessing."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHOWN = 5  # processes named; the rest counted


def holders(mountpoint: Path) -> list[str]:
    """`pid 123 (bash: working directory)` for each process whose working directory, root, executable or
    open files lie in the mount, as far as /proc lets this user see them."""
    inside = str(mountpoint).rstrip("/")
    found = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        uses = [what for what, link in _links(pid) if link == inside or link.startswith(inside + "/")]
        if uses:
            found.append(f"pid {pid} ({_name(pid)}: {', '.join(dict.fromkeys(uses))})")
    return found


def said(mountpoint: Path) -> str:
    """The holders in one phrase: `in use by pid 1 (bash: working directory), ...`, or that none is seen."""
    found = holders(mountpoint)
    if not found:
        return "in use (by no process this user can see)"
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return f"in use by {', '.join(found[:SHOWN])}{more}"


def _links(pid: int) -> list[tuple[str, str]]:
    links = []
    for what, name in (("working directory", "cwd"), ("root", "root"), ("executable", "exe")):
        with contextlib.suppress(OSError):  # gone, or not ours to see
            links.append((what, os.readlink(f"/proc/{pid}/{name}")))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return links
    for fd in fds:
        with contextlib.suppress(OSError):
            links.append(("open file", os.readlink(f"/proc/{pid}/fd/{fd}")))
    return links


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
