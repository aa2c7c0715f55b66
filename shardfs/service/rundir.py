"""Directories only their owner can write: the daemon's log and its stats socket live in them, so that on
a shared machine nobody else can plant a link where the daemon writes or a socket where a client connects."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path


def runtime_dir(uid: int) -> Path:
    """Where the daemon of uid keeps its stats socket. A client derives it from the uid alone, so it must
    not depend on the daemon's environment: /run/shardfs for root, systemd-logind's /run/user/UID when
    it is there (nobody else can create it), else /tmp/shardfs-UID."""
    if uid == 0:
        return Path("/run/shardfs")
    user_run = Path(f"/run/user/{uid}")
    with contextlib.suppress(OSError):
        st = os.lstat(user_run)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return user_run / "shardfs"
    return Path("/tmp") / f"shardfs-{uid}"


def own_dir(path: Path, mode: int) -> Path:
    """path as a directory of this user with exactly mode, made if missing. A link, a file or someone
    else's directory there is refused (PermissionError); a mode left open by an earlier version is closed."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path}: not a directory of this user")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)  # mkdir's mode passes through the umask (systemd's UMask=0077)
    return path


def trusted_dir(path: Path, uid: int) -> bool:
    """path is a real directory of uid that nobody else can write to (root can anyway)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def answers(path: Path, kind: int = socket.SOCK_STREAM) -> bool:
    """Whether a server listens at the Unix socket path (a stale file left by a killed one does not)."""
    with socket.socket(socket.AF_UNIX, kind) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True
