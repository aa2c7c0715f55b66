"""`python -m tests.support.fuse_serve SOURCE MOUNTPOINT` (or through tests.support.as_user, as that user):
SOURCE mounted at MOUNTPOINT (mount(2) as root, fusermount3 otherwise, or a handed `/dev/fd/N`) and served by shardfs's
own session until unmounted."""

from __future__ import annotations

import sys
from pathlib import Path

from shardfs.fs.bridge import Bridge
from shardfs.fuse.mount import MountOptions, mount, target_of
from shardfs.fuse.session import Serving, Session
from shardfs.source import open_source


def main(args: list[str]) -> int:
    source, mountpoint = args
    tree = open_source(source, 16 << 20).tree
    fd = mount(target_of(Path(mountpoint)), MountOptions(fsname=source))
    Session(fd, Bridge(tree, 0), Serving(threads=4)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
