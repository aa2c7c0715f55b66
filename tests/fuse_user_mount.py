"""`python -m tests.as_user UID GID tests.fuse_user_mount SOURCE MOUNTPOINT`: SOURCE mounted at MOUNTPOINT by
that user through fusermount3 and served by shardfs's own session until unmounted."""

from __future__ import annotations

from pathlib import Path

from shardfs.fuse.adapter import TreeOps
from shardfs.fuse.mount import MountOptions, mount
from shardfs.fuse.session import Session
from shardfs.source import open_source


def main(args: list[str]) -> int:
    source, mountpoint = args
    tree = open_source(source, 16 << 20).tree
    fd = mount(Path(mountpoint), MountOptions(fsname=source))
    Session(fd, TreeOps(tree, 0), threads=4).run()
    return 0
