"""Mounting with shardfs's own session keeps what libfuse 3.14 promised, through the real CLI and the kernel:
libfuse's options that a user relies on (`uid=`, `gid=`, `umask=`, `allow_root`, `auto_unmount`, `max_read`,
`debug`) do what they did; the ones that change nothing here are accepted, as they were; the ones that cannot
work are refused naming them. A `/dev/fd/N` mounted by a privileged parent (as CSI drivers do) is served
through the CLI, its stats and log named after its directory. A user mounts through fusermount3, in a mount
namespace of the test's own where that user may open /dev/fuse (nothing changes for the rest of the machine).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest
from cloudvolume import CloudVolume

from shardfs.fuse.mount import MountOptions, unmount
from shardfs.fuse.mount import mount as parent_mount
from shardfs.service.daemon import default_log_file, is_stale
from shardfs.service.rundir import runtime_dir
from shardfs.service.stats_socket import ask, socket_path
from tests.support.cli import SHARDFS, one_line_error, shardfs
from tests.support.daemons import REPO, daemon_of, wait_until
from tests.support.users import BIG, as_user, run_in_private_fuse

pytestmark = [pytest.mark.kernel, pytest.mark.root]


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
    ids kept, page caching by mtime, mtab) mounts as before, rather than being refused as unknown; the log
    names each, with why it changes nothing."""
    options = "clone_fd,max_idle_threads=4,noforget,remember=10,auto_cache,noauto_cache,ac_attr_timeout=5"
    m = mount(shared[0], "-o", f"{options},no_rofd_flush,user=nobody,kernel_cache,rw", "--log-level", "info")
    assert (m.path / "3").read_bytes() == b"three"
    said = [line for line in m.log_text().splitlines() if "event=option_ignored" in line]
    assert len(said) == 9 and any("-o clone_fd changes nothing: the threads take turns" in line for line in said)
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


@pytest.mark.parametrize("foreground", [False, True])
def test_a_descriptor_mounted_by_a_parent_is_served_through_the_cli(raw_volume, tmp_path, foreground) -> None:
    """What a CSI driver does: it mounts /dev/fuse itself and runs `shardfs mount SOURCE /dev/fd/N`. The
    daemon serves it (no check of /dev/fd/N as a directory, nothing stat'ed before it serves: the mount
    answers nothing until then), names its stats socket and default log after the directory the kernel
    shows the mount at, so `shardfs stats DIR` finds it, and ends when the parent unmounts."""
    source, _, expected = raw_volume
    m = tmp_path / "m"
    m.mkdir()
    log = default_log_file(m)
    log.unlink(missing_ok=True)
    fd = parent_mount(m, MountOptions(fsname=str(source)))
    if foreground:  # as fstab's mount.fuse3 runs it
        command = [*SHARDFS, str(source), f"/dev/fd/{fd}", "-o", "foreground,log_level=info"]
    else:
        command = [*SHARDFS, "mount", str(source), f"/dev/fd/{fd}", "--log-level", "info"]
    try:
        daemon = subprocess.Popen(command, pass_fds=[fd], stderr=subprocess.PIPE, text=True)
    finally:
        os.close(fd)
    try:
        if not foreground:
            assert daemon.wait(timeout=60) == 0, daemon.stderr and daemon.stderr.read()
        cv = CloudVolume(f"file://{m}", mip=0, fill_missing=True, progress=False)
        assert np.array_equal(cv[:, :, :], expected)
        stats = shardfs("stats", m)
        assert f"{source} at {m}, view native" in stats.stdout
        if not foreground:
            assert f"mounted {source} at {m}" in log.read_text()
        served_by = psutil.Process(ask(m)[0])  # its command line names /dev/fd/N, not m
        unmount(m)  # the parent's job
        served_by.wait(timeout=60)
        assert not socket_path(runtime_dir(0), m).exists()
    finally:
        if os.path.ismount(m):
            unmount(m, lazy=True)
        if daemon.poll() is None:
            daemon.kill()
        log.unlink(missing_ok=True)


def test_a_descriptor_mounted_out_of_sight_is_served_without_stats(raw_volume, tmp_path) -> None:
    """A daemon in a mount namespace where its parent's mount is not to be seen (a container's, or a kernel
    whose fdinfo does not name the connection) cannot name a stats socket after the directory: it serves
    all the same and says so in its log, and `shardfs stats` says no daemon serves it."""
    source, twin, _ = raw_volume
    m, log = tmp_path / "m", tmp_path / "log"
    m.mkdir()
    fd = parent_mount(m, MountOptions(fsname=str(source)))
    hidden = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'umount -l {m} && exec "$@"', "-"]
    command = [*hidden, *SHARDFS, "mount", str(source), f"/dev/fd/{fd}", "-f", "--log-file", str(log)]
    try:
        daemon = subprocess.Popen(command, pass_fds=[fd], cwd=REPO)
    finally:
        os.close(fd)
    try:
        name = sorted(p.name for p in (twin / "4_4_40").iterdir())[3]
        assert (m / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        assert "no shardfs daemon serves" in shardfs("stats", m, check=False).stderr
        assert "is not visible here: `shardfs stats` cannot reach this daemon" in log.read_text()
        unmount(m)
        assert daemon.wait(timeout=60) == 0
    finally:
        if os.path.ismount(m):
            unmount(m, lazy=True)
        if daemon.poll() is None:
            daemon.kill()


def test_dev_fd_n_that_is_not_a_fuse_descriptor_is_refused_in_one_line(shared, tmp_path) -> None:
    with open(tmp_path / "f", "w") as f:
        handed = f"/dev/fd/{f.fileno()}"
        command = [*SHARDFS, "mount", str(shared[0]), handed]
        done = subprocess.run(command, pass_fds=[f.fileno()], capture_output=True, text=True, timeout=60)
    one_line_error(done, 2, handed, "not a /dev/fuse descriptor")
    one_line_error(shardfs("mount", shared[0], "/dev/fd/999", check=False), 2, "/dev/fd/999", "not an open descriptor")


# Run as root inside a mount namespace of its own (PRIVATE_FUSE): the user mounts (through fusermount3), reads,
# asks for stats and unmounts; then mounts with auto_unmount and is killed. allow_other with it: fusermount3
# checks the dead mount as root, which the kernel refuses on a mount that lets only its user in (so
# fusermount3 3.14 leaves that one, for libfuse's daemons as for shardfs).
USER_MOUNTS = """
import json, os, signal, subprocess, sys, time
import psutil

source, point, log, uid, gid = sys.argv[1:]
cli = [sys.executable, "-m", "tests.support.as_user", uid, gid, "shardfs.cli"]
user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
run = lambda *command: subprocess.run(command, capture_output=True, text=True, timeout=60)
mounted = lambda: [ln.split(" - ")[1] for ln in open("/proc/self/mountinfo") if f" {point} " in ln]
out = {"mount": run(*cli, "mount", source, point, "--log-file", log).stderr, "line": mounted()}
out["read"] = run(*user, "cat", f"{point}/2").stdout
out["stats"] = run(*cli, "stats", point).stdout
out["unmount"] = run(*cli, "unmount", point).returncode
out["after_unmount"] = mounted()
out["auto"] = run(*cli, "mount", source, point, "--log-file", log, "-o", "auto_unmount,allow_other").stderr
out["auto_read"] = run(*user, "cat", f"{point}/3").stdout
ours = lambda p: point in (p.info["cmdline"] or []) and "shardfs.cli" in p.info["cmdline"]  # not fusermount3
next(p for p in psutil.process_iter(["cmdline"]) if ours(p)).send_signal(signal.SIGKILL)
deadline = time.monotonic() + 60
while mounted() and time.monotonic() < deadline:
    time.sleep(0.05)
out["after_kill"] = mounted()
print(json.dumps(out))
"""


def test_a_user_mounts_reads_and_unmounts_through_fusermount3(shared, user, public_tmp) -> None:
    """Not root: fusermount3 (setuid) mounts and hands the descriptor back; the user reads, `shardfs stats`
    finds the daemon, `shardfs unmount` unmounts; with `auto_unmount` a killed daemon's mount goes too.
    Everything happens in a mount namespace of the test's own: the machine's /dev/fuse stays 0600."""
    device = os.stat("/dev/fuse")
    out = run_in_private_fuse(USER_MOUNTS, shared[0], public_tmp, user)
    point = public_tmp / "m"
    assert out["mount"] == "" and len(out["line"]) == 1, out
    assert out["line"][0].startswith(f"fuse.shardfs {shared[0]} ro,user_id={user[0]},group_id={user[1]}")
    assert out["read"] == "two" and f"{shared[0]} at {point}" in out["stats"], out
    assert out["unmount"] == 0 and out["after_unmount"] == [], out
    assert out["auto"] == "" and out["auto_read"] == "three", out
    assert out["after_kill"] == [], out
    assert not os.path.ismount(point)  # the namespace's mounts never were the machine's
    assert os.stat("/dev/fuse").st_mode == device.st_mode  # the machine's device node untouched
