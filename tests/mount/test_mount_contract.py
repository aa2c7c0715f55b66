"""What the README promises of every mount, checked on live mounts through the kernel: the attributes of every
node against tensorstore's unsharded twin, the FUSE options the kernel was given (in /proc/self/mountinfo)
and what they do (requests that must never reach the daemon, counted by its own op counters), where the
metrics server listens, the default log directory's mode, and the detached daemon's exit status."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import peers
from tests.support.cli import SHARDFS, scrape, shardfs
from tests.support.cloud import free_port
from tests.support.daemons import daemon_of, machine_lock
from tests.support.reading import DROP_CACHES

pytestmark = [pytest.mark.kernel, pytest.mark.root]

MIB = 1 << 20
DEFAULT_TIMEOUT = 1.0  # attr_timeout and entry_timeout when none is given, as libfuse had them (negative: 0)


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A sharded volume (scale 4_4_40) with an unsharded scale (8_8_40), and tensorstore's unsharded twin."""
    where = tmp_path_factory.mktemp("contract")
    source, twin = where / "vol", where / "twin"
    peers.write_tensorstore_volume(source, unsharded_twin=twin)
    return source, twin


def op_counts(point: Path) -> dict[str, float]:
    """FUSE requests the daemon has answered, by operation, from `shardfs stats --prometheus`."""
    figures = scrape(shardfs("stats", "--prometheus", point).stdout)
    return {dict(labels)["op"]: v for (name, labels), v in figures.items() if name == "shardfs_fuse_op_seconds_count"}


def super_options(point: Path) -> set[str]:
    """The superblock options the kernel holds for the mount at point (the fields after ' - ')."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        if fields.split()[4] == str(point):
            return set(fs.split()[2].split(","))
    raise AssertionError(f"{point} is not in /proc/self/mountinfo")


def test_every_file_has_its_twins_size_and_every_node_the_sources_mtime(volume, mount) -> None:
    """st_size is exact for chunk files and passthrough files alike (the unsharded twin's), and for rewritten
    `info` files the length read; every node carries the source directory's mtime and a 1 MiB st_blksize."""
    source, twin = volume
    m = mount(source)
    mtime = os.stat(source).st_mtime_ns
    twin_files = [p.relative_to(twin) for p in twin.rglob("*") if p.is_file()]
    assert len(twin_files) > 100
    for rel in twin_files:
        st = os.stat(m.path / rel)
        expected = len((m.path / rel).read_bytes()) if rel.name == "info" else (twin / rel).stat().st_size
        assert (st.st_size, st.st_mtime_ns, st.st_blksize) == (expected, mtime, MIB), rel
    for directory in (m.path, m.path / "4_4_40", m.path / "8_8_40"):
        assert os.stat(directory).st_mtime_ns == mtime, directory


def test_listings_give_each_entrys_type_and_blocks_cover_each_file(volume, mount) -> None:
    """readdir's types (which `find` and os.walk trust without a stat) are stat's for every entry: the
    overlay's (rewritten `info`, a provider's directory), a provider's (chunk files) and the source's (the
    unsharded scale and its files); and every file's st_blocks covers its size to the next 512 bytes, so
    `du` is `du --apparent-size` rounded up per file."""
    m = mount(volume[0])
    kinds: dict[str, bool] = {}
    dirs = [m.path]
    while dirs:
        with os.scandir(dirs.pop()) as entries:
            for entry in entries:
                st = os.lstat(entry.path)
                rel = str(Path(entry.path).relative_to(m.path))
                kinds[rel] = entry.is_dir(follow_symlinks=False)
                assert kinds[rel] == stat.S_ISDIR(st.st_mode), rel
                if kinds[rel]:
                    dirs.append(Path(entry.path))
                else:
                    assert 0 <= st.st_blocks * 512 - st.st_size < 512, (rel, st.st_size, st.st_blocks)
    assert {k: kinds[k] for k in ("info", "4_4_40", "8_8_40")} == {"info": False, "4_4_40": True, "8_8_40": True}
    assert {kinds[k] for k in kinds if k.startswith(("4_4_40/", "8_8_40/"))} == {False}
    files = [k for k, is_dir in kinds.items() if not is_dir]
    du = (subprocess.run(["du", "-s", "-B1", *flag, m.path], capture_output=True, text=True, check=True)
          for flag in ([], ["--apparent-size"]))  # fmt: skip
    used, apparent = (int(done.stdout.split()[0]) for done in du)
    assert 0 <= used - apparent < 512 * len(files), (used, apparent)
    assert used == sum(-(-os.stat(m.path / f).st_size // 512) * 512 for f in files)


def test_the_kernel_holds_the_default_options(volume, mount) -> None:
    """`ro` and `default_permissions` (the kernel checks each node's modes) are the superblock's."""
    m = mount(volume[0])
    assert {"ro", "default_permissions"} <= super_options(m.path)


def test_a_file_read_twice_is_read_from_the_daemon_once(volume, mount) -> None:
    """Pages stay across opens (no_open keeps them; kernel_cache, where a kernel lacks no_open), so a second
    read of a file never enters the daemon."""
    m = mount(volume[0])
    chunk = m.path / "4_4_40" / "-5-11_3-19_7-15"
    with machine_lock(DROP_CACHES, shared=True):  # no other test drops the machine's inodes, and their pages
        first = chunk.read_bytes()
        before = op_counts(m.path)
        assert chunk.read_bytes() == first == (volume[1] / "4_4_40" / "-5-11_3-19_7-15").read_bytes()
        assert op_counts(m.path).get("read", 0) == before.get("read", 0)


def test_the_kernel_opens_files_without_asking(volume, mount) -> None:
    """FUSE no_open: OPEN is answered with ENOSYS once, after which the kernel opens files by itself (no
    OPEN, no RELEASE): twenty distinct files opened, at most one OPEN reached the daemon."""
    m = mount(volume[0])
    names = sorted(os.listdir(m.path / "4_4_40"))[:20]
    for name in names:
        assert (m.path / "4_4_40" / name).read_bytes() == (volume[1] / "4_4_40" / name).read_bytes()
    assert op_counts(m.path).get("open", 0) <= 1 and len(names) == 20


def test_names_attributes_and_absences_are_kept_by_the_kernel(volume, mount) -> None:
    """attr_timeout, entry_timeout and negative_timeout of a day: once past the defaults (1 s, 1 s and 0),
    a second stat of a file and of a missing name still never reaches the daemon."""
    m = mount(volume[0])
    chunk, missing = m.path / "4_4_40" / "-5-11_3-19_7-15", m.path / "4_4_40" / "0-1_0-1_0-1"
    size = chunk.stat().st_size
    assert not missing.exists()
    time.sleep(1.5 * DEFAULT_TIMEOUT)  # not a timing assertion: waits out what the defaults would keep
    before = op_counts(m.path)
    assert chunk.stat().st_size == size and not missing.exists()
    after = op_counts(m.path)
    assert [after.get(op, 0) for op in ("lookup", "getattr")] == [before.get(op, 0) for op in ("lookup", "getattr")]


def test_metrics_listen_on_loopback_by_default(volume, mount) -> None:
    port = free_port()
    m = mount(volume[0], "--metrics", str(port))
    listening = [c.laddr for c in daemon_of(m.path).net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", port)]


def test_the_default_log_directory_is_the_users_alone(volume, tmp_path) -> None:
    temp, point = tmp_path / "tmp", tmp_path / "m"
    temp.mkdir(mode=0o755)
    point.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    subprocess.run([*SHARDFS, "mount", volume[0], point], env=env, check=True, capture_output=True, timeout=60)
    try:
        directory = temp / f"shardfs-{os.getuid()}"
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert [p.name for p in directory.iterdir()] == [f"{str(point).strip('/').replace('/', '_')}.log"]
    finally:
        shardfs("unmount", point)


REAPER = """
import ctypes, os, signal, subprocess, sys, psutil

ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the detached daemon is ours
subprocess.run(sys.argv[1:], check=True)
(daemon,) = psutil.Process().children()
daemon.send_signal(signal.SIGTERM)
_, status = os.waitpid(daemon.pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_the_detached_daemon_exits_0_after_a_clean_unmount_on_sigterm(volume, tmp_path) -> None:
    """The daemon is not our child; a helper that is its subreaper collects its exit status."""
    point = tmp_path / "m"
    point.mkdir()
    command = [
        sys.executable,
        "-c",
        REAPER,
        *SHARDFS,
        "mount",
        str(volume[0]),
        str(point),
        "--log-file",
        str(tmp_path / "log"),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    finally:
        if os.path.ismount(point):
            shardfs("unmount", point)
    assert done.stdout.strip() == "0", done.stderr
    assert not os.path.ismount(point)
    assert "Traceback" not in (tmp_path / "log").read_text()
