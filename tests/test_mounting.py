"""Mounting with shardfs's own session keeps what libfuse 3.14 promised, through the real CLI and the kernel:
libfuse's options that a user relies on (`uid=`, `gid=`, `umask=`, `allow_root`, `auto_unmount`, `max_read`,
`debug`) do what they did; the ones that change nothing here are accepted, as they were; the ones that cannot
work are refused naming them.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shardfs.fuse.mount import unmount
from shardfs.service.daemon import is_stale
from tests import peers
from tests.conftest import as_user, shardfs
from tests.test_cli import one_line_error
from tests.test_daemon import daemon_of, wait_until

BIG = 100_000  # bytes of key 1: many pages, many READs when each is capped


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Path, dict[int, bytes]]]:
    """A key-value dataset any user may read, in a directory any user may search, and what it holds."""
    root = Path(tempfile.mkdtemp(prefix="shardfs-mounting-", dir="/tmp"))
    root.chmod(0o755)
    values = {1: np.random.default_rng(1).bytes(BIG), 2: b"two", 3: b"three"}
    peers.write_tensorstore_kv(root / "kv", values)
    for path in [root / "kv", *(root / "kv").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root / "kv", values
    shutil.rmtree(root, ignore_errors=True)


def mount_line(point: Path) -> list[str]:
    """The options the kernel shows for the mount at point."""
    line = next(ln for ln in Path("/proc/mounts").read_text().splitlines() if f" {point} " in ln)
    return line.split()[3].split(",")


def test_uid_gid_and_umask_show_every_node_with_them(shared, mount) -> None:
    """libfuse's high-level `uid=`, `gid=` and `umask=` (README: "the owner every node is shown with"): every
    node's owner, group, and permission bits `0777 & ~umask`, in place of the source's."""
    m = mount(shared[0], "-o", "uid=1234,gid=5678,umask=027")
    for path in (m.path, m.path / "2", m.path / "info"):
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, 0o750), path
    assert (m.path / "2").read_bytes() == b"two"


def test_allow_root_serves_root_and_refuses_every_other_user(shared, mount, user, public_tmp) -> None:
    """`allow_root`, as libfuse had it: mounted allow_other, and the daemon refuses (EACCES) every request
    of a user other than the mounting one and root, even for a file root has just read (its pages are in
    the kernel: the open must still be asked for). Under `allow_other` the same user reads it."""
    for options, readable in (("allow_other", True), ("allow_root", False)):
        m = mount(shared[0], "-o", options, under=public_tmp)
        assert "allow_other" in mount_line(m.path)
        assert (m.path / "2").read_bytes() == b"two"  # root
        cat, listing, looked_up = (
            as_user(user, *c) for c in (["cat", m.path / "2"], ["ls", m.path], ["stat", m.path / "3"])
        )
        if readable:
            assert (cat.returncode, cat.stdout) == (0, "two") and listing.returncode == looked_up.returncode == 0
        else:
            for done in (cat, listing, looked_up):
                assert done.returncode != 0 and "Permission denied" in done.stderr, done
        shardfs("unmount", m.path)


def test_auto_unmount_takes_the_mount_away_when_the_daemon_is_killed(shared, tmp_path) -> None:
    """kill -9 leaves a dead mount (ENOTCONN) behind; with `auto_unmount` fusermount3 (kept waiting, as
    libfuse had it, for root too) unmounts it as soon as the daemon is gone."""
    point = tmp_path / "m"
    point.mkdir()
    shardfs("mount", shared[0], point, "--log-file", tmp_path / "log", "-o", "auto_unmount")
    try:
        assert (point / "3").read_bytes() == b"three"
        daemon_of(point).kill()
        wait_until(lambda: not os.path.ismount(point))
        assert not is_stale(point)
    finally:
        if os.path.ismount(point):
            unmount(point, lazy=True)


def reads_of(log: str) -> int:
    return sum("event=fuse_request" in line and ": READ node" in line for line in log.splitlines())


def test_max_read_caps_every_read_and_debug_logs_each_request(shared, mount) -> None:
    """`max_read=N` reaches the kernel (shown in the mount's options), which then asks for at most N bytes
    at a time; `debug` logs every request (and sets the log level to DEBUG), as libfuse printed them."""
    capped = mount(shared[0], "-o", "max_read=8192,debug")
    assert "max_read=8192" in mount_line(capped.path)
    assert (capped.path / "1").read_bytes() == shared[1][1]
    assert reads_of(capped.log_text()) >= BIG // 8192
    whole = mount(shared[0], "-o", "debug")
    assert (whole.path / "1").read_bytes() == shared[1][1]
    assert 1 <= reads_of(whole.log_text()) <= 2  # 1 MiB a request (MAX_PAGES); readahead may split it once
    plain = mount(shared[0])
    assert (plain.path / "1").read_bytes() == shared[1][1]
    assert "fuse_request" not in plain.log_text()


def test_libfuse_options_that_change_nothing_here_are_accepted(shared, mount) -> None:
    """What libfuse 3.14 took and shardfs has no use for (threads that idle, a descriptor per thread, node
    ids kept, page caching by mtime, mtab) mounts as before, rather than being refused as unknown."""
    options = "clone_fd,max_idle_threads=4,noforget,remember=10,auto_cache,noauto_cache,ac_attr_timeout=5"
    m = mount(shared[0], "-o", f"{options},no_rofd_flush,user=nobody,kernel_cache,rw")
    assert (m.path / "3").read_bytes() == b"three"
    assert "ro" in mount_line(m.path)  # rw or not, shardfs is read-only


@pytest.mark.parametrize(
    "option, words",
    [
        ("blkdev", ["-o blkdev", "block device"]),
        ("blksize=4096", ["-o blksize", "blkdev"]),
        ("modules=subdir,subdir=x", ["-o modules", "subdir, iconv"]),
        ("uid=-1", ["invalid value uid=-1"]),
        ("umask=9", ["invalid value umask=9"]),
        ("max_read=lots", ["invalid value max_read=lots"]),
        ("use_ino", ["unknown option", "use_ino"]),  # gone from libfuse 3: it refused it too
    ],
)
def test_options_that_cannot_work_are_refused_naming_them(shared, tmp_path, option, words) -> None:
    point = tmp_path / "m"
    point.mkdir()
    done = shardfs("mount", shared[0], point, "--log-file", tmp_path / "log", "-o", option, check=False)
    one_line_error(done, 1, str(point), *words)
    assert not os.path.ismount(point)
