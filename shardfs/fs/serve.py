"""A tree served through shardfs's FUSE session: where the tree, the bridge and the session meet. fuse/serve.py
mounts and serves any `Filesystem`; here that filesystem is the bridge over a tree (bridge.py), made once the
connection's record is known (a new one, or the one a daemon before left) and closed when the mount ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from shardfs.fs.bridge import Bridge
from shardfs.fuse.mount import Target
from shardfs.fuse.record import Record
from shardfs.fuse.serve import Served, Settings
from shardfs.metrics import Metrics
from shardfs.tree import Tree


def served(tree: Tree, mtime_ns: int, mountpoint: Target, settings: Settings, metrics: Metrics | None = None) -> Served:
    """What fuse/serve.py's serve() serves for tree at mountpoint: its files' mtime mtime_ns, shown as settings
    ask (uid=, gid=, umask=, read_ahead=), counted in metrics (the mount's own)."""
    metrics = metrics or Metrics()

    @contextlib.contextmanager
    def bridge(record: Record | None) -> Iterator[Bridge]:
        made = Bridge(tree, mtime_ns, settings.shown, record, metrics, settings.read_ahead)
        try:
            yield made
        finally:
            made.close()

    return Served(bridge, mountpoint, settings, metrics)
