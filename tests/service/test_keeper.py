"""The keeper's protocol (shardfs/service/keeper.py) between processes: descriptors kept, taken back as the same
open file, dropped, refused to another user; a kept /dev/fuse whose mount ends is dropped by the keeper."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardfs.errors import ServiceError
from shardfs.fuse.mount import unmount
from shardfs.service import keeper, mountinfo, stats_socket
from tests.support.cli import shardfs
from tests.support.daemons import alive, peer_pid, wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.root]


@pytest.fixture
def keeper_at(tmp_path: Path) -> Iterator[Path]:
    yield from running_keeper(tmp_path / "keeper.sock")


def running_keeper(path: Path) -> Iterator[Path]:
    """A keeper process at path; ended (by its pid) after the test."""
    process = subprocess.Popen([sys.executable, "-m", "shardfs.service.keeper", str(path)])
    deadline = time.monotonic() + 60
    while not keeper.answers(path):
        assert time.monotonic() < deadline and process.poll() is None, "the keeper did not start"
        time.sleep(0.05)
    yield path
    process.kill()
    process.wait()


def same_file(a: int, b: int) -> bool:
    """Two descriptors of one open file: a write through one moves the offset both see."""
    return os.lseek(a, 0, os.SEEK_CUR) == os.lseek(b, 0, os.SEEK_CUR) and os.fstat(a).st_ino == os.fstat(b).st_ino


def test_kept_descriptors_come_back_as_the_same_open_files(keeper_at, tmp_path) -> None:
    first = os.memfd_create("first")
    second = os.memfd_create("second")
    keeper.keep(keeper_at, "/mnt/a b", [first, second])
    os.write(first, b"12345")  # moves the shared offset: the keeper's copy is the same open file
    taken = keeper.take(keeper_at, "/mnt/a b")
    assert len(taken) == 2 and same_file(taken[0], first) and same_file(taken[1], second)
    assert os.lseek(taken[0], 0, os.SEEK_CUR) == 5
    assert keeper.names(keeper_at) == ["/mnt/a b"]
    assert keeper.take(keeper_at, "/mnt/other") == []
    again = keeper.take(keeper_at, "/mnt/a b")  # taking leaves the keeper's copies: a second crash is covered
    assert len(again) == 2
    keeper.drop(keeper_at, "/mnt/a b")
    assert keeper.take(keeper_at, "/mnt/a b") == [] and keeper.names(keeper_at) == []
    for fd in [first, second, *taken, *again]:
        os.close(fd)


def test_keep_replaces_and_bad_requests_are_refused(keeper_at) -> None:
    old, new = os.memfd_create("old"), os.memfd_create("new")
    keeper.keep(keeper_at, "m", [old])
    keeper.keep(keeper_at, "m", [new])
    (taken,) = keeper.take(keeper_at, "m")
    assert os.fstat(taken).st_ino == os.fstat(new).st_ino
    with pytest.raises(ServiceError, match="KEEP takes a name"):
        keeper.keep(keeper_at, "m", [])
    with pytest.raises(ServiceError, match="unknown request"):
        keeper.Link(keeper_at).ask("STEAL m")


def test_a_second_keeper_at_the_same_socket_is_refused(keeper_at) -> None:
    with pytest.raises(ServiceError, match="already answers"):
        keeper.Keeper(keeper_at)


def test_another_user_is_not_served(public_tmp, other_user) -> None:
    """A /dev/fuse descriptor answers for the filesystem: another user must not take it. The socket is opened to
    all here (its mode is 0600) to show the keeper's own check refusing, not the socket's mode."""
    for path in running_keeper(public_tmp / "keeper.sock"):
        fd = os.memfd_create("secret")
        keeper.keep(path, "m", [fd])
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        probe = [*other_user, "tests.support.keeper_probe", str(path), "m"]
        run = subprocess.run(probe, capture_output=True, text=True, timeout=120)
        assert run.stdout.startswith("refused:") and "Permission denied" in run.stdout, run
        os.chmod(path, 0o666)
        run = subprocess.run(probe, capture_output=True, text=True, timeout=120)
        assert run.stdout.startswith("refused:") and "Permission denied" not in run.stdout, run  # the keeper's own
        assert len(keeper.take(path, "m")) == 1  # and root's own requests are still served


def test_a_keeper_socket_in_a_directory_others_can_write_is_refused(public_tmp, user, other_user) -> None:
    """Another user who binds the keeper's name first (a shared /tmp) would be handed root's /dev/fuse by KEEP,
    or hand back a connection of their own by TAKE: a daemon refuses the name before it sends anything."""
    shared = public_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    squatter = subprocess.Popen([*other_user, "shardfs.service.keeper", str(shared / "k.sock")])
    try:
        assert wait_for(lambda: keeper.answers(shared / "k.sock"))
        with pytest.raises(ServiceError, match="open to other users"):
            keeper.Link(shared / "k.sock")
        with pytest.raises(ServiceError, match="open to other users"):
            keeper.started(shared / "k.sock")
        # Its socket moved (by root) into a directory closed to others still answers to its user's keeper: the
        # listener's uid is refused.
        closed = public_tmp / "closed"
        closed.mkdir(mode=0o755)
        os.rename(shared / "k.sock", closed / "k.sock")
        assert keeper.answers(closed / "k.sock")
        with pytest.raises(ServiceError, match=f"listened to by uid {user[0]}"):
            keeper.take(closed / "k.sock", "/mnt/x")
    finally:
        squatter.kill()
        squatter.wait()


def test_a_full_backlog_is_waited_for(keeper_at) -> None:
    """A keeper busy with others (its backlog full) makes a TAKE wait, not fail at once."""
    fd = os.memfd_create("kept")
    keeper.keep(keeper_at, "m", [fd])
    pid = peer_pid(keeper_at)
    os.kill(pid, signal.SIGSTOP)
    filling = []
    try:
        while True:  # connections the stopped keeper never accepts, until the kernel's backlog is full
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.setblocking(False)
            try:
                conn.connect(str(keeper_at))
            except BlockingIOError:
                conn.close()
                break
            filling.append(conn)
        assert len(filling) >= keeper.BACKLOG
        with ThreadPoolExecutor(1) as pool:
            taken = pool.submit(keeper.take, keeper_at, "m")
            time.sleep(0.5)
            assert not taken.done(), taken.exception() if taken.done() else None
            for conn in filling:
                conn.close()
            os.kill(pid, signal.SIGCONT)
            fds = taken.result(timeout=60)
        assert len(fds) == 1 and os.fstat(fds[0]).st_ino == os.fstat(fd).st_ino
    finally:
        os.kill(pid, signal.SIGCONT)
        for conn in filling:
            conn.close()


def test_a_mount_held_by_a_live_link_is_busy_for_others(keeper_at) -> None:
    """A daemon's link holds its mount: another TAKE or KEEP is BUSY until that link ends."""
    fd = os.memfd_create("kept")
    serving = keeper.Link(keeper_at)
    serving.keep("m", [fd])
    start = time.monotonic()
    with pytest.raises(ServiceError, match=f"a live daemon \\(pid {os.getpid()}\\) serves this mount"):
        keeper.take(keeper_at, "m")
    assert time.monotonic() - start >= keeper.HANDOVER_GRACE
    with pytest.raises(ServiceError, match="unexpected answer to KEEP: BUSY"):
        keeper.keep(keeper_at, "m", [fd])
    assert len(serving.take("m")) == 1  # its own link may take it again
    serving.close()  # the daemon's end: the mount is free for the next
    assert len(keeper.take(keeper_at, "m")) == 1


def daemon_of(point: Path) -> int:
    return stats_socket.ask(point)[0]


def test_a_keeper_mount_survives_restarts_after_its_socket_has_aged(raw_volume, tmp_path) -> None:
    """A keeper socket in the runtime directory beside the stats sockets, older than a minute: the clean-up of
    dead stats sockets at each daemon's start must leave it alone. Three kill -9 and restarts, each after the
    keeper socket's time is set back two minutes (what the clean-up looks at), keep the mount and its bytes."""
    source, twin, _ = raw_volume
    point = tmp_path / "m"
    point.mkdir()
    path = keeper.default_path().parent / f"keeper-test-{os.getpid()}-{time.monotonic_ns()}.sock"
    command = ["mount", source, point, "--log-file", tmp_path / "log", "-o", f"keeper={path}"]
    shardfs(*command)
    keeper_pid = peer_pid(path)
    name = sorted(p.name for p in (twin / "4_4_40").iterdir())[7]
    try:
        device = mountinfo.topmost(point).device
        for _ in range(3):
            aged = time.time() - 2 * stats_socket.SETTLED
            os.utime(path, (aged, aged))
            os.kill(daemon_of(point), signal.SIGKILL)
            shardfs(*command)
            assert keeper.answers(path), "the keeper's socket was removed"
            assert mountinfo.topmost(point).device == device
            assert (point / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        assert peer_pid(path) == keeper_pid  # one keeper throughout
    finally:
        with contextlib.suppress(OSError):
            pid = daemon_of(point)
            unmount(point, lazy=True)
            os.kill(pid, signal.SIGKILL)
        os.kill(keeper_pid, signal.SIGKILL)
        path.unlink(missing_ok=True)


def linked_mountpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A mountpoint `real/m` with two more names, `parent/m` (a linked parent) and `link` (a link to it), and
    where a keeper of its own listens."""
    point = tmp_path / "real" / "m"
    point.mkdir(parents=True)
    (tmp_path / "parent").symlink_to(tmp_path / "real")
    (tmp_path / "link").symlink_to(point)
    return point, tmp_path / "keeper.sock"


@pytest.mark.parametrize("first", ["real", "link"])
def test_a_second_daemon_never_takes_up_a_live_mount(raw_volume, tmp_path, first) -> None:
    """A second `shardfs mount -o keeper` of a mount a daemon serves, by its path, through a linked parent or as
    a link to it, is refused, however the first was named: two daemons on one connection would show each
    other's directories."""
    source, twin, _ = raw_volume
    point, path = linked_mountpoint(tmp_path)
    given_first = point if first == "real" else tmp_path / "link"
    shardfs("mount", source, given_first, "--log-file", tmp_path / "log", "-o", f"keeper={path}")
    keeper_pid = peer_pid(path)
    first = daemon_of(point)
    name = sorted(p.name for p in (twin / "4_4_40").iterdir())[3]
    try:
        for given in (point, tmp_path / "parent" / "m", tmp_path / "link"):
            run = shardfs("mount", source, given, "--log-file", tmp_path / "log2", "-o", f"keeper={path}", check=False)
            assert run.returncode != 0, (given, run)
            assert f"shardfs already serves {source} here (daemon pid {first})" in run.stderr, (given, run.stderr)
            assert daemon_of(point) == first
            assert (point / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        assert keeper.names(path) == [str(point)]
    finally:
        unmount(point, lazy=True)
        os.kill(first, signal.SIGKILL)
        os.kill(keeper_pid, signal.SIGKILL)


def test_a_mount_named_through_links_restarts_into_itself_by_any_of_its_names(raw_volume, tmp_path) -> None:
    """The keeper holds a connection under its mountpoint's real path: mounted through a linked parent, each
    daemon killed -9 and the next started by another name of the same mountpoint (a link to it, its real path,
    the linked parent again) takes the connection up: the same mount, its bytes, one entry in the keeper."""
    source, twin, _ = raw_volume
    point, path = linked_mountpoint(tmp_path)
    given = tmp_path / "parent" / "m"
    shardfs("mount", source, given, "--log-file", tmp_path / "log", "-o", f"keeper={path}")
    keeper_pid = peer_pid(path)
    device = mountinfo.topmost(point).device
    name = sorted(p.name for p in (twin / "4_4_40").iterdir())[5]
    try:
        for given in (tmp_path / "link", point, tmp_path / "parent" / "m"):
            os.kill(daemon_of(point), signal.SIGKILL)
            shardfs("mount", source, given, "--log-file", tmp_path / "log", "-o", f"keeper={path}")
            assert mountinfo.topmost(point).device == device, given  # taken up, not mounted afresh
            assert (point / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
            assert keeper.names(path) == [str(point)]
    finally:  # whatever is left, however it went: a daemon that mounted afresh stacks its mount on the kept one
        pids = [keeper_pid]
        with contextlib.suppress(Exception):
            pids.append(daemon_of(point))
        while mountinfo.topmost(point) is not None:
            unmount(point, lazy=True)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_root_mount_never_hands_its_connection_to_another_users_keeper(raw_volume, public_tmp, tmp_path, user,
                                                                         other_user) -> None:  # fmt: skip
    """Another user's keeper listening where root's `-o keeper=SOCKET` points (a shared directory): root's mount
    is refused in one line and nothing is mounted; the squatter receives no descriptor (its LIST stays empty)."""
    source, _, _ = raw_volume
    shared = public_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    squatter = subprocess.Popen([*other_user, "shardfs.service.keeper", str(shared / "k.sock")])
    point = tmp_path / "m"
    point.mkdir()
    try:
        assert wait_for(lambda: keeper.answers(shared / "k.sock"))
        run = shardfs("mount", source, point, "-o", f"keeper={shared / 'k.sock'}", check=False)
        assert run.returncode != 0 and "open to other users" in run.stderr, run
        assert not os.path.ismount(point)
        listed = subprocess.run([*other_user, "tests.support.keeper_list", str(shared / "k.sock")], capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert listed.stdout.strip() == "names: []", listed
    finally:
        squatter.kill()
        squatter.wait()


def test_a_keeper_holding_nothing_ends_once_it_cannot_be_reached(raw_volume, tmp_path) -> None:
    """Its mount unmounted, a keeper waits at its socket for the next one. Its socket removed (as logout removes
    /run/user/UID) and the next `mount -o keeper` starting another keeper there, it can never be asked anything
    again: it exits, after a grace, and the new keeper holds the new mount."""
    point, path = tmp_path / "m", tmp_path / "keeper.sock"
    point.mkdir()
    command = ["mount", raw_volume[0], point, "--log-file", tmp_path / "log", "-o", f"keeper={path}"]
    shardfs(*command)
    old = peer_pid(path)
    new = None
    try:
        shardfs("unmount", point)
        assert wait_for(lambda: keeper.names(path) == [])
        time.sleep(2 * keeper.ORPHAN_CHECK + 1)  # two of its checks, each finding it reached
        assert peer_pid(path) == old
        path.unlink()
        removed = time.monotonic()
        shardfs(*command)
        new = peer_pid(path)
        assert new != old
        assert wait_for(lambda: not alive(old), 60), "the keeper that nobody can reach is still there"
        assert time.monotonic() - removed >= keeper.ORPHAN_CHECK
        assert alive(new) and keeper.names(path) == [str(point)]
    finally:
        shardfs("unmount", point, check=False)
        for pid in (old, new):
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)
