"""What the kernel says is mounted where: /proc/self/mountinfo, read without trusting the mountpoint's path.

Both `shardfs stats` (whose daemon's uid the kernel records as `user_id=`) and `shardfs unmount` (which
must touch nothing but a shardfs mount) ask it about the topmost mount at a path."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
SHARDFS_TYPE = "fuse.shardfs"


@dataclass(frozen=True, slots=True)
class Mounted:
    fstype: str
    options: str  # the superblock's options: for FUSE, user_id=, group_id=, allow_other...
    source: str = ""  # for shardfs, its fsname: the dataset's path or URL (a URL's password shown as ***)
    device: str = ""  # major:minor of its superblock; for FUSE, 0:<connection number>
    point: str = ""  # where it is mounted, as the kernel names it (its real path, once resolved)

    @property
    def daemon_uid(self) -> int | None:
        """The uid of the FUSE daemon serving it, as the kernel recorded it at mount time."""
        found = re.search(r"(?:^|,)user_id=(\d+)(?:,|$)", self.options)
        return int(found.group(1)) if self.fstype.startswith("fuse") and found else None


def topmost(mountpoint: Path) -> Mounted | None:
    """The last (so the visible) mount at mountpoint's real path, or None when nothing is mounted there. The
    path is first resolved without a look at mountpoint itself (its directory resolved, its own name kept): a
    look asks the daemon for its root's attributes, which a stopped or wedged daemon never answers, and
    `list` and `stats` would hang on it. Only a path nothing is mounted at as named (a link to a mountpoint)
    is resolved whole."""
    absolute = os.path.abspath(mountpoint)
    found = _last_at(os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute)))
    return found if found is not None else _last_at(os.path.realpath(mountpoint))


def _last_at(where: str) -> Mounted | None:
    found = None
    for point, mounted in _mounts():
        if point == where:
            found = mounted
    return found


def exactly_at(point: str) -> Mounted | None:
    """The topmost mount at point as given, with nothing resolved: no path inside a mount is looked at, so
    that a mount whose daemon hangs cannot hang the caller (a CSI plugin being asked to unmount it)."""
    found = None
    for at, mounted in _mounts():
        if at == point:
            found = mounted
    return found


def at_device(device: str) -> str | None:
    """Where the mount of device (`0:39`) is, as this process sees it; None if nowhere."""
    return next((point for point, mounted in _mounts() if mounted.device == device), None)


def shardfs_mounts() -> list[tuple[str, Mounted]]:
    """Every shardfs mount this process can see, by mountpoint, in mount order."""
    return [(point, mounted) for point, mounted in _mounts() if mounted.fstype == SHARDFS_TYPE]


def _mounts() -> Iterator[tuple[str, Mounted]]:
    for line in MOUNTINFO.read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        fstype, source, options, *_ = fs.split()
        _, _, device, _, point, *_ = fields.split()
        yield _unescape(point), Mounted(fstype, options, _unescape(source), device, _unescape(point))


def _unescape(field: str) -> str:
    """A mountinfo field as written: spaces, tabs, newlines and backslashes are octal escapes there."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
