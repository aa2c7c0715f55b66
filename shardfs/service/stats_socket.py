"""How `shardfs stats` reaches a daemon: a Unix socket file in the runtime directory of the daemon's user.

Only that user can write the directory, and the client learns the user from the mount itself (the kernel
records a FUSE daemon's uid as `user_id=` in /proc/self/mountinfo), then checks the directory's owner and
the answering process's credentials. So another local user can neither take the name first (which would
block the mount) nor answer in the daemon's place (which would fake its figures). Root's socket is in
/run/shardfs and open to every local user: the figures are counts, nothing of the data.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shardfs.errors import ServiceError
from shardfs.service import mountinfo
from shardfs.service.lifecycle import IDLE_TIMEOUT
from shardfs.service.rundir import answers, own_dir, runtime_dir, trusted_dir

SETTLED = 60  # seconds after which a stats socket that answers nobody is a dead daemon's
STATS_NAME = re.compile(r"[0-9a-f]{32}\.sock")  # as socket_path names them
UCRED = struct.Struct("3i")  # pid, uid, gid, as SO_PEERCRED gives them
ASK_TIMEOUT = 5.0  # seconds `shardfs stats` and `list` wait for a daemon's figures


def socket_path(directory: Path, mountpoint: Path, real: bool = False) -> Path:
    """Named by a hash of the mountpoint's real path: any path fits in a socket address (107 bytes). real:
    mountpoint is the kernel's own path already (from mountinfo), not to be resolved: resolving looks at
    the mount, which for a descriptor mounted by a parent answers nothing until the daemon serves it."""
    digest = hashlib.sha256(os.fsencode(mountpoint if real else os.path.realpath(mountpoint))).hexdigest()[:32]
    return directory / f"{digest}.sock"


def serve(mountpoint: Path, figures: Callable[[], bytes], real: bool = False) -> Callable[[], None]:
    """Answer every connection with figures(), then close it. Returns what removes the socket on exit. real:
    as for socket_path."""
    uid = os.getuid()
    try:
        directory = own_dir(runtime_dir(uid), 0o755 if uid == 0 else 0o700)
    except PermissionError as e:
        raise ServiceError(f"{e}; cannot serve shardfs stats") from None
    _sweep(directory)
    path = socket_path(directory, mountpoint, real)
    if answers(path):
        raise ServiceError(f"{mountpoint}: another shardfs daemon already serves stats for it")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # ours, left by a daemon that was killed
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    server.bind(str(path))
    os.chmod(path, 0o666)  # the directory decides who may connect
    server.listen(8)

    def answer() -> None:
        while True:
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):
                conn.settimeout(IDLE_TIMEOUT)  # a client that never reads holds up the next one no longer
                conn.sendall(figures())

    threading.Thread(target=answer, name="shardfs-stats", daemon=True).start()

    def remove() -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    return remove


def _sweep(directory: Path) -> None:
    """Remove the stats sockets of daemons that were killed (kill -9 leaves them): only what is proven dead and
    a stats socket, named as socket_path names them, a stream socket that refuses a connection (the keeper's
    socket and others of another type answer EPROTOTYPE, and are not ours to judge). One bound in the last
    minute is left alone, since its daemon may not be listening yet."""
    settled = time.time() - SETTLED
    for path in directory.iterdir():
        with contextlib.suppress(OSError):
            if STATS_NAME.fullmatch(path.name) and path.lstat().st_mtime < settled and _refused(path):
                path.unlink()


def _refused(path: Path) -> bool:
    """Whether the stream socket at path is a dead one: connect(2) refused (nobody listens on it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return False


class NoDaemon(ServiceError):
    """No daemon listens for the mount: it died, or is being replaced."""


def shardfs_at(mountpoint: Path) -> mountinfo.Mounted | None:
    """The shardfs mount at mountpoint (the topmost mount there), or None."""
    found = mountinfo.topmost(mountpoint)
    return found if found is not None and found.fstype == mountinfo.SHARDFS_TYPE else None


def read(mountpoint: Path) -> str:
    """The figures of the daemon mounted at mountpoint, once its directory and credentials check out."""
    return ask(mountpoint)[1]


def ask(mountpoint: Path) -> tuple[int, str]:
    """The pid of the daemon mounted at mountpoint and its figures, once its directory and credentials
    check out."""
    found = shardfs_at(mountpoint)
    missing = NoDaemon(f"{mountpoint}: no shardfs daemon serves this mountpoint")
    uid = None if found is None else found.daemon_uid
    if found is None or uid is None:
        raise missing
    directory = runtime_dir(uid)
    if os.path.lexists(directory) and not trusted_dir(directory, uid):
        raise ServiceError(f"{directory}: not a directory of uid {uid} closed to others; its stats are not trusted")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(ASK_TIMEOUT)  # a stopped or wedged daemon must not hang `stats` or `list`
        try:
            # named by the kernel's path: resolving mountpoint would look at the mount, which a stopped daemon
            # never answers (its root's attributes are asked for once the kernel's copy expires)
            conn.connect(str(socket_path(directory, Path(found.point), real=True)))
        except OSError:
            raise missing from None
        pid, peer, _ = UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
        if peer != uid:
            raise ServiceError(f"{mountpoint}: stats answered by uid {peer}, not by the mount's daemon (uid {uid})")
        try:
            return pid, b"".join(iter(lambda: conn.recv(1 << 16), b"")).decode()
        except TimeoutError:
            raise ServiceError(f"{mountpoint}: its daemon (pid {pid}) did not answer in {ASK_TIMEOUT:g} s") from None
