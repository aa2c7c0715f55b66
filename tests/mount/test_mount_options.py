"""What a mount's options and names can do to it, through the real CLI and the kernel: a bad value is refused
before mount(2), and whatever fails after mount(2) takes the mount away (nothing dead is left behind); a source
path that ends in a backslash keeps its mount a `fuse.shardfs` one through fusermount3; names longer than any
Linux filesystem holds are absent without a log line, and one user's errors never use up the log lines that
let another user's through (issue 27)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shardfs.service import mountinfo
from shardfs.service.daemon import is_stale
from tests.support import peers
from tests.support.cli import one_line_error, shardfs
from tests.support.daemons import REPO
from tests.support.users import as_user, run_in_private_fuse

pytestmark = [pytest.mark.kernel, pytest.mark.root]


def mounted_at(point: Path) -> list[str]:
    """The filesystem types mounted at point, as /proc/self/mountinfo says, dead mounts included."""
    return [m.fstype for p, m in mountinfo._mounts() if p == str(point)]


@pytest.mark.parametrize(
    "option", ["attr_timeout=nan", "entry_timeout=inf", "attr_timeout=1e30", "negative_timeout=-1", "entry_timeout=x"]
)
def test_a_timeout_the_kernel_cannot_take_is_refused_before_anything_is_mounted(shared, tmp_path, option) -> None:
    """nan and inf used to mount and then kill the daemon (a dead mount left behind); 1e30 mounted and then
    failed every GETATTR with a traceback. Each is refused in one line, exit 1, and nothing is mounted."""
    point = tmp_path / "m"
    point.mkdir()
    done = shardfs("mount", shared[0], point, "--log-file", tmp_path / "log", "-o", option, check=False)
    try:
        one_line_error(done, 1, str(point), f"invalid value {option}")
        assert mounted_at(point) == [] and not is_stale(point)
    finally:
        if mounted_at(point):
            subprocess.run(["umount", "-l", point], check=False)


# Serves the dataset with threads that cannot all start, as on a machine at its thread limit (CPython's own
# RuntimeError past the Nth thread); prints what is mounted at the point once serve() has failed.
THREADS_RUN_OUT = """
import json, sys, threading
from pathlib import Path
from shardfs.fs.serve import served
from shardfs.fuse import serve
from shardfs.service import mountinfo
from shardfs.source import open_source
source, point = sys.argv[1:]
started = threading.Thread.start
count = [0]
def start(thread):
    if thread.name.startswith("fuse-"):
        count[0] += 1
        if count[0] > 3:
            raise RuntimeError("can't start new thread")
    started(thread)
threading.Thread.start = start
options = {"ro": True, "max_threads": "50", "fsname": source}
try:
    settings = serve.settings_of(options, Path(point))
    serve.serve(served(open_source(Path(source), 1 << 20).tree, 0, Path(point), settings), lambda granted: None)
except RuntimeError as e:
    print(json.dumps({"error": str(e), "mounted": [m.fstype for p, m in mountinfo._mounts() if p == point]}))
"""


def test_a_failure_after_mount_takes_the_mount_away(shared, tmp_path) -> None:
    point = tmp_path / "m"
    point.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", THREADS_RUN_OUT, shared[0], point], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    try:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == '{"error": "can\'t start new thread", "mounted": []}', done.stdout
        assert not is_stale(point)
    finally:
        if mounted_at(point):
            subprocess.run(["umount", "-l", point], check=False)


def test_a_source_path_ending_in_a_backslash_mounts_as_shardfs_through_fusermount3(shared, tmp_path) -> None:
    """fusermount3 (root's too, with auto_unmount) reads a backslash in `fsname=` as taking the next character
    as it is: unescaped, a path ending in `\\` swallowed the comma and `subtype=shardfs` with it, and the mount
    was plain `fuse`, which `shardfs list` left out and `shardfs unmount` refused."""
    source = tmp_path / "data\\"
    shutil.copytree(shared[0], source)
    point = tmp_path / "m"
    point.mkdir()
    shardfs("mount", source, point, "--log-file", tmp_path / "log", "-o", "auto_unmount")
    try:
        found = mountinfo.topmost(point)
        assert found is not None and (found.fstype, found.source) == ("fuse.shardfs", str(source)), found
        assert (point / "2").read_bytes() == b"two"
        assert str(point) in shardfs("list").stdout
        shardfs("unmount", point)
        assert mounted_at(point) == []
    finally:
        if mounted_at(point):
            subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture
def broken(public_tmp: Path) -> Path:
    """A key-value dataset any user may read, each of whose shards is cut short: every value is EIO."""
    root = public_tmp / "kv"
    peers.write_tensorstore_kv(root, {k: bytes([k]) * 100 for k in range(1, 9)})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
        if path.suffix == ".shard":
            path.write_bytes(path.read_bytes()[:40])
    return root


def test_names_too_long_for_linux_are_absent_and_one_users_errors_leave_the_others_logged(
    broken, mount, user, public_tmp
) -> None:
    """Another user stats names of 256 to 1,024 bytes (the kernel passes FUSE names up to 1,024): each is
    ENOENT, with no log line and no error counted (they were tried on the source, logged `os_error` and
    counted ENAMETOOLONG). Then the user reads broken values over and over, past the burst of error lines
    a minute: root's read of another broken value is still logged, with whose request it was."""
    m = mount(broken, "-o", "allow_other", under=public_tmp)
    for size in (256, 300, 1024):
        done = as_user(user, "stat", m.path / ("a" * size))
        assert done.returncode == 1 and "No such file or directory" in done.stderr, done.stderr
    assert (m.path / ("b" * 255)).exists() is False  # 255 is a name like any other: looked up, absent
    assert "os_error" not in m.log_text() and "ENAMETOOLONG" not in shardfs("stats", m.path).stdout
    for _ in range(30):
        done = as_user(user, "cat", m.path / "1")
        assert done.returncode == 1 and "Input/output error" in done.stderr, done.stderr
    theirs = [line for line in m.log_text().splitlines() if f" uid={user[0]} " in line]
    assert 0 < len(theirs) <= 20 and all("event=eio path=/1 " in line for line in theirs), theirs
    with pytest.raises(OSError) as e:
        (m.path / "2").read_bytes()
    assert e.value.errno == errno.EIO
    assert any("event=eio path=/2 " in line and " uid=0 " in line for line in m.log_text().splitlines())


# Class 1 of issue 33: options against a second user and against their zero values.
@pytest.fixture
def owned(public_tmp: Path, user) -> Path:
    """A key-value dataset owned by the unprivileged user, with a file passed through in a 0750 directory,
    under a directory any user may search."""
    root = public_tmp / "kv"
    peers.write_tensorstore_kv(root, {1: b"one", 2: b"two"})
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("hello")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
        os.chown(path, *user)
    (root / "notes").chmod(0o750)
    (root / "info").chmod(0o640)
    return root


def modes(point: Path) -> dict[str, tuple[int, int, int]]:
    return {
        name: (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
        for name in ("", "1", "info", "notes", "notes/readme.txt")
        for st in [(point / name).stat()]
    }


def test_a_default_mount_shows_the_sources_owners_and_read_bits_and_zero_values_are_values(owned, mount, user) -> None:
    """Default: each node the source's owner and group, read and search bits only (no write bit, whatever the
    source has), a file in a 0750 directory closed to others as on disk. `uid=0,gid=0,umask=0` show root,
    root and 0777 everywhere: zero is a value, not "unset"."""
    uid, gid = user
    shown = modes(mount(owned).path)
    assert shown == {
        "": (uid, gid, 0o555),
        "1": (uid, gid, 0o444),  # a chunk: its shard's owner and read bits
        "info": (uid, gid, 0o440),
        "notes": (uid, gid, 0o550),
        "notes/readme.txt": (uid, gid, 0o440),  # 0644, inside a directory others cannot search
    }, shown
    zeros = modes(mount(owned, "-o", "uid=0,gid=0,umask=0").path)
    assert set(zeros.values()) == {(0, 0, 0o777)}, zeros
    assert set(modes(mount(owned, "-o", f"uid={uid},umask=0777").path).values()) == {(uid, gid, 0)}


# Run as root inside a mount namespace of its own (test_mounting.PRIVATE_FUSE): the user mounts through
# fusermount3 with allow_root and mount flags; the user, root and a third user (nobody) read; the options the
# kernel shows for the mount are printed.
USER_ALLOW_ROOT = """
import json, subprocess, sys

source, point, log, uid, gid, flags = sys.argv[1:]
cli = [sys.executable, "-m", "tests.support.as_user", uid, gid, "shardfs.cli"]
run = lambda *command: subprocess.run(command, capture_output=True, text=True, timeout=60)
as_ = lambda who, *command: run("setpriv", f"--reuid={who}", f"--regid={who}", "--clear-groups", "--", *command)
out = {"mount": run(*cli, "mount", source, point, "--log-file", log, "-o", f"allow_root,{flags}").stderr}
out["line"] = [ln.split() for ln in open("/proc/self/mountinfo") if f" {point} " in ln]
out["user"] = as_(uid, "cat", f"{point}/2").stdout
out["root"] = run("cat", f"{point}/2").stdout
out["nobody"] = as_("65534", "cat", f"{point}/2").stderr
out["unmount"] = run(*cli, "unmount", point).returncode
print(json.dumps(out))
"""


def test_allow_root_on_a_users_mount_serves_that_user_and_root_and_no_one_else(shared, user, public_tmp) -> None:
    """allow_root had only been tried on root's own mounts, where the owner is root. Mounted by the unprivileged
    user (through fusermount3): the user and root read, a third user (nobody) is refused; the mount flags the
    user asked for reach the kernel as fusermount3 passes them, nosuid and nodev always."""
    out = run_in_private_fuse(USER_ALLOW_ROOT, shared[0], public_tmp, user, "noexec,noatime")
    assert out["mount"] == "" and len(out["line"]) == 1, out
    assert (out["user"], out["root"]) == ("two", "two"), out
    assert "Permission denied" in out["nobody"], out
    assert out["unmount"] == 0, out
    per_mount, fstype = out["line"][0][5], out["line"][0][-3]
    assert fstype == "fuse.shardfs", out["line"]
    assert set(per_mount.split(",")) == {"ro", "nosuid", "nodev", "noexec", "noatime"}, per_mount


# Class 2 of issue 33: mount flags, as /proc/self/mountinfo shows them (per mount, then the superblock's).
SAFE = {"ro", "nosuid", "nodev"}
FLAGS = [  # -o, then what mountinfo shows per mount and on the superblock; None: fusermount3 3.14 does not know it
    ("", SAFE | {"relatime"}, set(), True),
    ("noexec,noatime", SAFE | {"noexec", "noatime"}, set(), True),
    ("noexec,noatime,exec,atime", SAFE | {"relatime"}, set(), True),  # the later of two contrary flags wins
    ("nodiratime,strictatime", SAFE | {"nodiratime"}, set(), False),
    ("relatime,norelatime", SAFE | {"relatime"}, set(), False),  # neither noatime nor strictatime: the kernel's
    ("sync,dirsync", SAFE | {"relatime"}, {"sync", "dirsync"}, True),
    ("sync,async", SAFE | {"relatime"}, set(), True),
    ("suid,dev", SAFE | {"relatime"}, set(), True),  # what mount.fuse3 adds for root: no effect
]


@pytest.mark.parametrize("how", ["mount(2)", "fusermount3"])
@pytest.mark.parametrize("options, per_mount, on_superblock, known", FLAGS, ids=[f[0] or "default" for f in FLAGS])
def test_mount_flags_reach_the_kernel(shared, tmp_path, how, options, per_mount, on_superblock, known) -> None:
    """Each flag as mount(8) means it, whether root mounts with mount(2) or through fusermount3 (auto_unmount;
    a flag fusermount3 3.14 does not know is refused in its words, nothing mounted). Every shardfs mount is
    nosuid and nodev, even when root asks for suid and dev (as mount.fuse3 does for every root fstab mount):
    it shows no device and no set-user-ID bit."""
    point = tmp_path / "m"
    point.mkdir()
    given = ",".join(filter(None, [options, "auto_unmount" if how == "fusermount3" else ""]))
    done = shardfs(
        "mount", shared[0], point, "--log-file", tmp_path / "log", *(["-o", given] if given else []), check=False
    )
    try:
        if how == "fusermount3" and not known:
            one_line_error(done, 1, "fusermount3: unknown option")
            assert mounted_at(point) == []
            return
        assert done.returncode == 0, done.stderr
        found = [ln.split() for ln in Path("/proc/self/mountinfo").read_text().splitlines() if f" {point} " in ln]
        assert len(found) == 1, found
        assert set(found[0][5].split(",")) == per_mount, found[0]
        assert {"sync", "dirsync"} & set(found[0][-1].split(",")) == on_superblock, found[0]
        assert (point / "2").read_bytes() == b"two"
    finally:
        if mounted_at(point):
            shardfs("unmount", point)
