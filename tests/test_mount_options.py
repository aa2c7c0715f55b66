"""What a mount's options and names can do to it, through the real CLI and the kernel: a bad value is refused
before mount(2), and whatever fails after mount(2) takes the mount away (nothing dead is left behind); a source
path that ends in a backslash keeps its mount a `fuse.shardfs` one through fusermount3; names longer than any
Linux filesystem holds are absent without a log line, and one user's errors never use up the log lines that
let another user's through (issue 27)."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardfs.service import mountinfo
from shardfs.service.daemon import is_stale
from tests import peers
from tests.conftest import REPO, as_user, shardfs
from tests.test_cli import one_line_error
from tests.test_mounting import shared  # noqa: F401  (a fixture: a dataset any user may read)


def mounted_at(point: Path) -> list[str]:
    """The filesystem types mounted at point, as /proc/self/mountinfo says, dead mounts included."""
    return [m.fstype for p, m in mountinfo._mounts() if p == str(point)]


@pytest.mark.parametrize(
    "option", ["attr_timeout=nan", "entry_timeout=inf", "attr_timeout=1e30", "negative_timeout=-1", "entry_timeout=x"]
)
def test_a_timeout_the_kernel_cannot_take_is_refused_before_anything_is_mounted(shared, tmp_path, option) -> None:  # noqa: F811
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
    serve.serve(open_source(Path(source), 1 << 20).tree, 0, Path(point), options, lambda granted: None)
except RuntimeError as e:
    print(json.dumps({"error": str(e), "mounted": [m.fstype for p, m in mountinfo._mounts() if p == point]}))
"""


def test_a_failure_after_mount_takes_the_mount_away(shared, tmp_path) -> None:  # noqa: F811
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


def test_a_source_path_ending_in_a_backslash_mounts_as_shardfs_through_fusermount3(shared, tmp_path) -> None:  # noqa: F811
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
