"""The daemon's lifecycle, through the real CLI: readiness, detaching, signals, stale mounts, options."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardfs.service import stats_socket
from shardfs.service.daemon import is_stale
from tests.support import peers
from tests.support.cli import SHARDFS, scrape, shardfs
from tests.support.daemons import daemon_of, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.root]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("daemon") / "vol"
    peers.write_tensorstore_volume(root, extra_unsharded_scale=False)
    return root


def test_mount_in_command_substitution_returns_once_live(source, tmp_path) -> None:
    point = tmp_path / "m"
    point.mkdir()
    script = f"out=$({' '.join(SHARDFS)} mount {source} {point} --log-file {tmp_path}/log); ls {point}/4_4_40 | wc -l"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=True)
    assert int(done.stdout) == 5 * 4 * 5  # listed straight after mount returned
    shardfs("unmount", point)
    assert not os.path.ismount(point)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(source, mount, sig) -> None:
    m = mount(source, "--log-level", "info")
    daemon = daemon_of(m.path)
    daemon.send_signal(sig)
    daemon.wait(timeout=60)  # not our child, so no exit status here: the foreground test checks that it is 0
    assert not daemon.is_running()
    assert not os.path.ismount(m.path)
    assert "Traceback" not in m.log_text()
    assert "event=mounted" in m.log_text() and "event=unmounted" in m.log_text()


def test_stale_mount_is_cleared(source, mount) -> None:
    m = mount(source)
    daemon_of(m.path).kill()  # kill -9: the kernel keeps a mount that answers ENOTCONN
    wait_until(lambda: is_stale(m.path))
    again = shardfs("mount", source, m.path, "--log-file", m.log)
    assert os.path.ismount(m.path) and len(os.listdir(m.path / "4_4_40")) == 100
    assert again.stderr == f"WARNING: clearing the stale mount at {m.path}\n"  # before detaching: to the caller


def test_second_mount_on_a_live_mountpoint_refuses(source, mount) -> None:
    """Refused in one line naming what is there (its source and daemon) and what to do."""
    m = mount(source)
    again = shardfs("mount", source, m.path, check=False)
    pid = stats_socket.ask(m.path)[0]
    said = f"{m.path}: shardfs already serves {source} here (daemon pid {pid}); `shardfs unmount {m.path}` first"
    assert again.returncode == 1 and again.stderr == f"shardfs: {said}\n", again.stderr
    assert len(os.listdir(m.path / "4_4_40")) == 100


def test_mount_options_and_fsname(source, mount) -> None:
    m = mount(source, "-o", "allow_other", "--cache-size", "8M")
    line = next(ln for ln in Path("/proc/mounts").read_text().splitlines() if f" {m.path} " in ln)
    device, _, fstype, options, *_ = line.split()
    assert device == str(source) and fstype == "fuse.shardfs"
    assert {"ro", "allow_other"} <= set(options.split(","))
    budget = scrape(shardfs("stats", "--prometheus", m.path).stdout)["shardfs_cache_budget_bytes", frozenset()]
    assert budget == 8 << 20  # --cache-size 8M reached the daemon


def test_foreground_stays_attached_and_exits_on_sigterm(source, tmp_path) -> None:
    point = tmp_path / "m"
    point.mkdir()
    proc = subprocess.Popen([*SHARDFS, "mount", "-f", str(source), str(point)], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: os.path.ismount(point))
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not os.path.ismount(point)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_source_that_is_missing_or_a_file_refuses(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    result = shardfs("mount", tmp_path / "nothing", tmp_path / "m", check=False)
    assert result.returncode == 2 and "nothing: does not exist" in result.stderr
    (tmp_path / "file").write_text("")
    result = shardfs("mount", tmp_path / "file", tmp_path / "m", check=False)
    assert result.returncode == 2 and "file: not a directory" in result.stderr


def test_permissions_follow_the_source(public_tmp, mount) -> None:
    """Every node carries the owner and read/search bits of what it stands for (a chunk its shard's, a
    directory its source directory's, never write bits), narrowed by the directories above: the source's
    0750 root takes every bit of others away (tests/hostile/test_isolation.py tries them as another user)."""
    root = public_tmp / "vol"
    peers.write_tensorstore_volume(root, extra_unsharded_scale=True)
    (root / "private.txt").write_text("secret")
    os.chmod(root / "private.txt", 0o600)
    os.chmod(root, 0o750)
    os.chown(root / "4_4_40", 1234, 5678)
    m = mount(root)
    chunk = next((m.path / "4_4_40").iterdir())
    owner = root.stat()
    for path, mode, uid, gid in [
        (chunk, 0o440, owner.st_uid, owner.st_gid),  # its shard's
        (m.path / "4_4_40", 0o000, 1234, 5678),  # its owner and group cannot pass the 0750 root: nobody may
        (m.path / "info", 0o440, owner.st_uid, owner.st_gid),
        (m.path / "private.txt", 0o400, owner.st_uid, owner.st_gid),
        (m.path / "8_8_40", 0o550, owner.st_uid, owner.st_gid),
        (m.path, 0o550, owner.st_uid, owner.st_gid),
    ]:
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, uid, gid), path


def test_max_threads_caps_the_sessions_threads(tmp_path, mount) -> None:
    """`-o max_threads=1` reaches the session: sixteen readers at once are served right by its one thread,
    and the daemon starts no thread while they read."""
    volume, twin = tmp_path / "vol", tmp_path / "twin"
    peers.write_tensorstore_volume(volume, unsharded_twin=twin, extra_unsharded_scale=False)
    expected = {p.name: p.read_bytes() for p in (twin / "4_4_40").iterdir()}
    m = mount(volume, "-o", "max_threads=1")
    daemon = daemon_of(m.path)
    assert (m.path / "4_4_40" / "-5-11_3-19_7-15").read_bytes() == expected["-5-11_3-19_7-15"]
    threads = daemon.num_threads()
    with ThreadPoolExecutor(16) as pool:
        got = dict(zip(expected, pool.map(lambda n: (m.path / "4_4_40" / n).read_bytes(), expected), strict=True))
    assert got == expected
    assert daemon.num_threads() <= threads
