"""What the kernel says is mounted where: /proc/self/mountinfo, read without trusting the mountpoint's path.

Both `shardfs stats` (whose daemon's uid the kernel records as `user_id=`) and `shardfs unmount` (which
must touch nothing but a shardfs mount) ask it about the topmost mount at a path."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
SHARDFS_TYPE = "fuse.shardfs"


@dataclass(frozen=True, slots=True)
class Mounted:
    fstype: str
    options: str  # the superblock's options: for FUSE, user_id=, group_id=, allow_other...

    @property
    def daemon_uid(self) -> int | None:
        """The uid of the FUSE daemon serving it, as the kernel recorded it at mount time."""
        found = re.search(r"(?:^|,)user_id=(\d+)(?:,|$)", self.options)
        return int(found.group(1)) if self.fstype.startswith("fuse") and found else None


def topmost(mountpoint: Path) -> Mounted | None:
    """The last (so the visible) mount at mountpoint's real path, or None when nothing is mounted there."""
    where = os.path.realpath(mountpoint)
    found = None
    for line in MOUNTINFO.read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields.split()[4])
        if point == where:
            fstype, _, options, *_ = fs.split()
            found = Mounted(fstype, options)
    return found
