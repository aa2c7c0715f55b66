"""`python -m shardfs.csi.daemon UID GID FD KEEPER TARGET`: the unprivileged daemon that serves one volume.

The plugin starts it as root for two things only: to import from wherever Python lies (an image's
/usr/local, a pyenv under /root), and to take the mounted /dev/fuse descriptor from the plugin's keeper at
KEEPER, under the name TARGET (the keeper answers root and its own user only). Then, before it reads
anything else, it becomes UID:GID with no supplementary groups, no capabilities, no_new_privs, and not
dumpable, so that another process of the same user (another volume's daemon) cannot read its memory or
environment, where the publish secret will be. It reads the volume from the socket FD (see handoff.py) and
serves it as `shardfs mount SOURCE /dev/fd/N -f` would, logging to the stderr it shares with the plugin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import logging
import os
import re
import socket
import sys
from pathlib import Path

from shardfs.context import Context
from shardfs.csi import handoff
from shardfs.csi.volume import Volume
from shardfs.errors import ServiceError, SourceError
from shardfs.fuse.record import Kept, RecordError
from shardfs.logs import log_to, log_to_terminal, redact
from shardfs.service import keeper, lifecycle
from shardfs.service.daemon import Mount, serve, settings
from shardfs.source import open_source
from shardfs.stores.remote import Access

# What serving may import only later (credentials.aws, for an s3:// source), imported while the daemon is still
# root: where the interpreter lies under a directory its user cannot reach, an import after would fail.
IMPORTED_FIRST = ("boto3", "botocore.session", "botocore.exceptions", "obstore.auth.boto3")
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


class _ToPlugin:
    """Where a fresh connection is kept for the next daemon (a fuse.record Carrier): the plugin, over the
    socket, which keeps it in its keeper."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def keep(self, kept: Kept) -> None:
        handoff.keep(self.sock, kept.fds)


class _Naming(logging.Filter):
    """Every record starts with the volume's target: the daemons of all volumes share the plugin's stderr."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.prefix = f"{target}: ".replace("%", "%%")  # the message is a %-format

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.prefix + str(record.msg)
        return True


def become(uid: int, gid: int) -> None:
    """This process as uid:gid, with no way back: no groups, no capabilities, no_new_privs, not dumpable."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # from root to another user: the kernel clears every capability set
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for option in (PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE):
        if libc.prctl(option, 1 if option == PR_SET_NO_NEW_PRIVS else 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option})")
    held = re.findall(r"^Cap(?:Inh|Prm|Eff|Amb):\s*([0-9a-f]+)$", Path("/proc/self/status").read_text(), re.M)
    if os.getuid() == 0 or any(int(mask, 16) for mask in held):
        raise PermissionError(f"still privileged after becoming {uid}:{gid}")


def main(argv: list[str]) -> int:
    uid, gid, fd = (int(a) for a in argv[:3])
    holder, target = Path(argv[3]), argv[4]
    sock = socket.socket(fileno=fd)
    try:
        for name in IMPORTED_FIRST:
            importlib.import_module(name)
        fds = keeper.take(holder, target)  # as root: the keeper answers root and its own user only
        if not fds:
            raise ValueError(f"{holder}: the keeper holds no descriptor for {target}")
        fuse_fd = fds[0]
        kept = Kept.of(fds) if len(fds) == 2 else None  # with its record: a daemon before served it
        become(uid, gid)
        volume = Volume.from_json(handoff.take(sock))
    except (OSError, ValueError, TypeError, ServiceError, RecordError) as e:
        handoff.answer(sock, f"{handoff.FAILED}{e}")
        return 1
    os.environ.update(volume.secrets)  # this process's only: the AWS and GCS credential chains read them here
    log_to_terminal(volume.log_level)
    log_to(None)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Naming(target))
    lifecycle.block_signals()  # before obstore's runtime starts a thread
    access = Access(volume.anonymous, volume.endpoint, volume.region, volume.timeout, None, volume.requester_pays)
    context, mountpoint = Context(), Path(f"/dev/fd/{fuse_fd}")
    try:
        source = open_source(volume.source, volume.cache_size, volume.view, volume.max_file_size, access, None, context)
    except SourceError as e:
        handoff.answer(sock, f"{handoff.REFUSED}{redact(str(e))}")
        return 2
    try:
        mount = Mount(source.tree, mountpoint, settings(volume.options, mountpoint), context, source.name, volume.view)
        serve(mount, lambda: handoff.answer(sock, handoff.READY), None, _ToPlugin(sock), kept)
    except Exception as e:
        handoff.answer(sock, f"{handoff.FAILED}{redact(str(e))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
