"""What another local user does: coreutils run as the tests' unprivileged user, a Python script run in a mount
namespace where that user may open /dev/fuse, and directory handles it holds (tests/support/dir_holder.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemons import REPO

USER = "shardfs-test"  # an unprivileged local user: the other users a root `allow_other` mount serves


def as_user(user: tuple[int, int], *command: str | Path) -> subprocess.CompletedProcess[str]:
    """A command run as the unprivileged user, with no supplementary groups: coreutils only, since the
    user cannot reach the test's Python."""
    drop = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
    return subprocess.run([*drop, *map(str, command)], capture_output=True, text=True, errors="replace", timeout=60)


BIG = 100_000  # bytes of key 1 of conftest's `shared` dataset: many pages, many READs when each is capped


# /dev/fuse a node the user may open, and fuse.conf's user_allow_other, in this namespace alone.
PRIVATE_FUSE = (
    "mount -t tmpfs none /run && mkdir /run/fuse && mknod -m 666 /run/fuse/fuse c 10 229"
    " && mount --bind /run/fuse/fuse /dev/fuse && echo user_allow_other > /run/fuse/fuse.conf"
    ' && mount --bind /run/fuse/fuse.conf /etc/fuse.conf && exec "$@"'
)


def run_in_private_fuse(script: str, source: Path, where: Path, user: tuple[int, int], *args: str) -> dict:
    """The Python script, run in a mount namespace of its own (PRIVATE_FUSE) with the arguments source, a
    mountpoint `where/m` and a log `where/log` (both the user's), the user's uid and gid, then args; what it
    printed, as JSON. The script drops to the user itself."""
    point, log = where / "m", where / "log"
    point.mkdir()
    os.chown(point, *user)
    log.touch()
    os.chown(log, *user)
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_FUSE, "-"]
    command = [sys.executable, "-c", script, str(source), str(point), str(log), *map(str, user), *args]
    done = subprocess.run([*private, *command], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def hold_directory(other_user: list[str], directory: Path, handles: int) -> subprocess.Popen[str]:
    """tests/support/dir_holder.py run as the other user: it opens the directory handles times, says so on stdout, and
    holds every handle until its stdin closes."""
    command = [*other_user, "tests.support.dir_holder", directory, str(handles)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
