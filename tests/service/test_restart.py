"""A daemon replaced under a live mount: killed (SIGKILL), handed over (SIGUSR2) or upgraded (a second checkout
of the tree), while 16 readers wait on a remote source at 200 ms a request and a listing is half read. The
connection waits in systemd's file-descriptor store (this test plays systemd: a notify socket that receives
FDSTORE=1, then LISTEN_FDS/LISTEN_FDNAMES/LISTEN_PID and the descriptors from 3) or in a keeper; the next
daemon takes it up, the kernel resends what was read and never answered, and every reader gets the bytes
tensorstore wrote, with no error, the mount never gone."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from shardfs.fs.nodes import PACKED
from shardfs.fuse.mount import unmount
from shardfs.service import keeper, mountinfo, stats_socket
from shardfs.service.handover import FUSE_NAME, HANDED_OVER, RECORD_NAME
from tests.support.cli import SHARDFS, scrape, shardfs
from tests.support.daemons import REPO, alive, peer_pid
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]

LATENCY = 0.2  # seconds the server takes to answer each request
READERS = 16
PATIENCE = 120  # seconds: only a hang reaches it
SCALE = "4_4_40"


@pytest.fixture(scope="module")
def new_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second copy of the package, elsewhere, as an upgrade installs it: run with PYTHONPATH pointing at it."""
    where = tmp_path_factory.mktemp("upgrade")
    shutil.copytree(REPO / "shardfs", where / "shardfs", ignore=shutil.ignore_patterns("__pycache__"))
    return where


@dataclass
class Systemd:
    """systemd's part: the notify socket, the store it fills, and the start of ExecStart with what it holds."""

    socket_path: Path
    sock: socket.socket = field(init=False)
    store: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.socket_path))
        self.sock.settimeout(PATIENCE)

    def until(self, word: str) -> None:
        """Take messages (and the descriptors pushed with FDSTORE=1) until one says word."""
        while True:
            data, fds, _, _ = socket.recv_fds(self.sock, 4096, 8, socket.MSG_CMSG_CLOEXEC)
            lines = data.decode().splitlines()
            self.messages.append(data.decode())
            if "FDSTOREREMOVE=1" in lines:
                name = next(line[7:] for line in lines if line.startswith("FDNAME="))
                if name in self.store:
                    os.close(self.store.pop(name))
            elif "FDSTORE=1" in lines:
                name = next(line[7:] for line in lines if line.startswith("FDNAME="))
                assert len(fds) == 1, lines
                if name in self.store:
                    os.close(self.store[name])
                self.store[name] = fds[0]
            else:
                for fd in fds:
                    os.close(fd)
            if word in lines:
                return

    def start(self, command: list[str], env: dict[str, str]) -> Launch:
        """ExecStart as systemd runs it (once go() is called): the stored descriptors from 3, named in
        LISTEN_FDNAMES, LISTEN_PID the started process's own."""
        return Launch(command, {**env, "NOTIFY_SOCKET": str(self.socket_path)}, dict(self.store))

    def close(self) -> None:
        for fd in self.store.values():
            os.close(fd)
        self.sock.close()


# The launcher: waits for a line on stdin, then puts the named descriptors at 3, 4, ... with LISTEN_FDS,
# LISTEN_FDNAMES and its own pid as LISTEN_PID (as systemd does between fork and exec), and becomes the command.
LAUNCHER = """
import os, sys

sys.stdin.readline()
names, command = sys.argv[1].split(":") if sys.argv[1] else [], sys.argv[3:]
fds = [int(f) for f in sys.argv[2].split(",") if f]
high = [os.dup(fd) for fd in fds]  # out of the way of 3, 4, ...
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.set_inheritable(3 + i, True)
for fd in {*fds, *high} - set(range(3, 3 + len(fds))):
    os.close(fd)
if names:
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.execvp(command[0], command)
"""


class Launch:
    """A command made ready to start (forked, waiting) and started by go(). The test's process holds files of
    the mount: a child forked while no daemon serves it would hang closing them (FLUSH) before its exec, as
    systemd, which holds none, never does; so the daemon after is forked before any is opened."""

    def __init__(
        self, command: list[str], env: dict[str, str], passed: dict[str, int] | None = None, output: bool = False
    ) -> None:  # fmt: skip
        passed = passed or {}
        fds = ",".join(map(str, passed.values()))
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, ":".join(passed), fds, *command], env=env, pass_fds=list(passed.values()),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE if output else None, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def output(self) -> str:
        """Start the command, wait for its end, and return what it printed."""
        process = self.go()
        assert process.stdout is not None
        printed = process.stdout.read()
        process.wait(timeout=PATIENCE)
        return printed

    def go(self) -> subprocess.Popen[str]:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.close()
        return self.process


def device_of(point: Path) -> str | None:
    """The mount's device (0:<connection>) as the kernel lists it, without asking the daemon."""
    found = mountinfo.topmost(point)
    return None if found is None else found.device


class MountWatch:
    """Looks at the mount table every 10 ms from a thread: whether the mount at point was ever gone."""

    def __init__(self, point: Path) -> None:
        self.point, self.device, self.gone = point, device_of(point), False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            if device_of(self.point) != self.device:
                self.gone = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def read_all(paths: list[Path]) -> list[tuple[Path, bytes | OSError]]:
    out: list[tuple[Path, bytes | OSError]] = []
    for path in paths:
        try:
            out.append((path, path.read_bytes()))
        except OSError as e:
            out.append((path, e))
    return out


@pytest.mark.parametrize(
    ("carrier", "how"),
    [("systemd", "kill"), ("keeper", "kill"), ("systemd", "hand over"), ("keeper", "hand over"),
     ("systemd", "new code"), ("keeper", "new code")],
)  # fmt: skip
def test_a_replaced_daemon_loses_no_request(many_chunks, new_code, tmp_path, carrier, how) -> None:
    source, twin = many_chunks
    point = tmp_path / "m"
    point.mkdir()
    keeper_path = tmp_path / "keeper.sock"
    systemd = Systemd(tmp_path / "notify")
    env = dict(os.environ)
    # The daemon after: this code, or a second checkout of it (with the same interpreter).
    after_env = {**env, "PYTHONPATH": str(new_code)} if how == "new code" else env
    if how == "new code":
        where = subprocess.run(
            [sys.executable, "-c", "import shardfs; print(shardfs.__file__)"], env=after_env, cwd=tmp_path,
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert where.startswith(str(new_code)), where
    names = sorted(p.name for p in (twin / SCALE).iterdir())
    assert len(names) == 2048
    daemons: list[subprocess.Popen[str]] = []
    keeper_pid = None
    after: Launch | None = None
    listed: Launch | None = None
    pool = ThreadPoolExecutor(READERS)
    detached: list[int] = []  # the keeper's daemons, detached: no children of the test
    with RangeServer(source).running() as server:
        url = f"precomputed://{server.url}"
        log = tmp_path / "shardfs.log"
        if carrier == "systemd":
            command = [*SHARDFS, "mount", "--foreground", url, str(point), "--log-file", str(log)]
            daemons.append(systemd.start(command, env).go())
            systemd.until("READY=1")
            assert set(systemd.store) == {FUSE_NAME, RECORD_NAME}
        else:
            command = [*SHARDFS, "mount", url, str(point), "--log-file", str(log), "--log-level", "info"]
            command += ["-o", f"keeper={keeper_path}"]
            subprocess.run(command, check=True, timeout=PATIENCE, capture_output=True)
            keeper_pid = peer_pid(keeper_path)
            assert keeper.names(keeper_path) == [str(point)]
        try:
            first_pid = daemons[0].pid if daemons else stats_socket.ask(point)[0]
            detached += [] if daemons else [first_pid]
            after = systemd.start(command, after_env) if carrier == "systemd" else Launch(command, after_env)
            listed = Launch([*SHARDFS, "list"], env, output=True)
            watch = MountWatch(point)
            assert watch.device is not None
            # The metadata looked up first: the listed directory's table id is then one that a table begun
            # afresh would give another path (and the kernel, on ESTALE, looks names up again).
            assert (point / "info").stat().st_size > 0
            # A listing begun, and left half-way: the kernel holds its handle and offset across the restart.
            listing = os.scandir(point / SCALE)
            seen = [next(listing).name for _ in range(300)]
            server.latency = LATENCY
            rng = np.random.default_rng(0)
            cold = [point / SCALE / n for n in rng.choice(names[300:], READERS * 4, replace=False)]
            reads = [pool.submit(read_all, cold[i::READERS]) for i in range(READERS)]
            deadline = time.monotonic() + PATIENCE
            while server.in_flight < READERS // 2:  # FUSE requests read and not answered: waiting on the server
                assert time.monotonic() < deadline
                time.sleep(0.005)
            os.kill(first_pid, signal.SIGKILL if how == "kill" else signal.SIGUSR2)
            killed = time.monotonic()
            if carrier == "systemd":
                code = daemons[0].wait(timeout=PATIENCE)
                assert code == (-signal.SIGKILL if how == "kill" else HANDED_OVER), daemons[0].stderr.read()
                gap_listed = listed.output()
                daemons.append(after.go())
                systemd.until("READY=1")
            else:
                while alive(first_pid):
                    time.sleep(0.01)
                gap_listed = listed.output()
                assert after.go().wait(timeout=PATIENCE) == 0, after.process.stderr.read()
                detached.append(stats_socket.ask(point)[0])
            gap = time.monotonic() - killed
            results = [r for f in reads for r in f.result(timeout=PATIENCE)]
            seen += [entry.name for entry in listing]
            listing.close()
            watch.stop()
            errors = [(p.name, r) for p, r in results if isinstance(r, OSError)]
            assert not errors, errors
            wrong = [p.name for p, r in results if r != (twin / SCALE / p.name).read_bytes()]
            assert not wrong, wrong
            assert len(results) == len(cold)
            assert sorted(seen) == sorted({*names, *seen}) and len(seen) == len(set(seen)) == len(names)
            assert not watch.gone and device_of(point) == watch.device  # one connection throughout
            assert (point / SCALE / names[0]).read_bytes() == (twin / SCALE / names[0]).read_bytes()
            assert gap < PATIENCE
            assert "a kept connection taken up" in log.read_text()
            figures = scrape(shardfs("stats", point, "--prometheus").stdout)
            assert figures[("shardfs_fuse_resent_requests_total", frozenset())] > 0  # read before, answered after
            assert any(
                line.split()[0] == str(point) and line.endswith("daemon being replaced")
                for line in gap_listed.splitlines()
            ), gap_listed
        finally:
            server.latency = 0
            for launch in (after, listed):
                if launch is not None and launch.process.stdin is not None and not launch.process.stdin.closed:
                    launch.process.kill()  # never started
            with contextlib.suppress(OSError):
                unmount(point, lazy=True)  # umount2 itself: `shardfs unmount` would statfs a mount none serves
            # A failed run may leave readers waiting on requests no daemon will answer: everything holding the
            # connection ends, so that the kernel ends them too, before the readers are waited for.
            for daemon in daemons:
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
            for pid in detached:
                deadline = time.monotonic() + 30
                while alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            systemd.close()
            if keeper_pid is not None:
                os.kill(keeper_pid, signal.SIGKILL)
            pool.shutdown(wait=True, cancel_futures=True)


def test_a_mount_whose_daemon_is_gone_for_good_is_unmounted_and_let_go(many_chunks, tmp_path) -> None:
    """A killed daemon that nobody starts again: the keeper holds the mount, whose requests wait; a mount
    without the keeper is refused saying so, `shardfs unmount` still ends it at once (it asks the mount table,
    not the mount), and the keeper lets it go."""
    source, _ = many_chunks
    point, keeper_path = tmp_path / "m", tmp_path / "keeper.sock"
    point.mkdir()
    shardfs("mount", source, point, "-o", f"keeper={keeper_path}")
    keeper_pid = peer_pid(keeper_path)
    try:
        daemon = stats_socket.ask(point)[0]
        os.kill(daemon, signal.SIGKILL)
        while alive(daemon):
            time.sleep(0.01)
        assert keeper.names(keeper_path) == [str(point)]
        again = shardfs("mount", source, point, check=False)  # without the keeper: refused, not hung on statfs
        assert again.returncode == 1 and "waits for its next daemon" in again.stderr, again.stderr
        shardfs("unmount", point)
        assert device_of(point) is None
        deadline = time.monotonic() + PATIENCE
        while keeper.names(keeper_path):  # the keeper sees the connection end (POLLERR) and closes its copies
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        with contextlib.suppress(OSError):
            unmount(point, lazy=True)
        os.kill(keeper_pid, signal.SIGKILL)


@pytest.mark.parametrize("carrier", ["systemd", "keeper"])
def test_a_connection_kept_for_another_source_is_let_go_not_taken_up(
    many_chunks, raw_volume, tmp_path, carrier
) -> None:  # fmt: skip
    """The unit's SOURCE changed, then a crash: the next daemon is asked for another dataset than the kept
    connection serves. Taking it up would have the kernel's cached names read the other dataset's bytes; it is
    let go (the old mount detached, its descriptors dropped from the store) and the new source mounted afresh.
    A file of the old mount still open reads its own bytes or an error, never the new source's."""
    source, twin = many_chunks
    other, other_twin, _ = raw_volume
    point = tmp_path / "m"
    point.mkdir()
    log = tmp_path / "shardfs.log"
    systemd = Systemd(tmp_path / "notify")
    keeper_path = tmp_path / "keeper.sock"
    env = dict(os.environ)

    def command(of: Path) -> list[str]:
        if carrier == "systemd":
            return [*SHARDFS, "mount", "--foreground", str(of), str(point), "--log-file", str(log)]
        return [*SHARDFS, "mount", str(of), str(point), "--log-file", str(log), "-o", f"keeper={keeper_path}"]

    first: subprocess.Popen[str] | None = None
    daemons: list[int] = []
    try:
        if carrier == "systemd":
            first = systemd.start(command(source), env).go()
            systemd.until("READY=1")
            after = systemd.start(command(other), env)
        else:
            subprocess.run(command(source), check=True, timeout=PATIENCE, capture_output=True)
            after = Launch(command(other), env)
        old_device = device_of(point)
        daemons.append(stats_socket.ask(point)[0])
        name = sorted(os.listdir(twin / SCALE))[1]
        held = open(point / SCALE / name, "rb")  # noqa: SIM115 (read after the change)
        _killed_and_replaced(daemons[0], after, systemd if carrier == "systemd" else None)
        if carrier == "systemd":
            assert set(systemd.store) == {FUSE_NAME, RECORD_NAME}
        daemons.append(stats_socket.ask(point)[0])
        assert "it is let go and the mount made afresh" in log.read_text()
        assert device_of(point) not in (None, old_device)  # a new connection
        try:
            got: bytes | OSError = held.read()
        except OSError as e:
            got = e
        finally:
            with contextlib.suppress(OSError):  # its FLUSH fails as its read did: the connection has ended
                held.close()
        assert isinstance(got, OSError) or got == (twin / SCALE / name).read_bytes()
        assert sorted(os.listdir(point)) == sorted(os.listdir(other_twin))
        other_name = sorted(os.listdir(other_twin / SCALE))[1]
        assert (point / SCALE / other_name).read_bytes() == (other_twin / SCALE / other_name).read_bytes()
    finally:
        _take_down(point, daemons, first, systemd, keeper_path)


@pytest.mark.parametrize("carrier", ["systemd", "keeper"])
def test_a_chunk_held_below_a_directory_of_datasets_reads_after_its_daemon_is_replaced(
    many_chunks, raw_volume, tmp_path, carrier
) -> None:  # fmt: skip
    """A directory of three datasets: a chunk of the first read, one of the second held open; their node ids
    pack the numbers their directories got as they were browsed. The daemon killed, the next one takes the
    connection up and is asked first for a chunk of the third (a number it gives now, past those it restored):
    the held file reads its own bytes, by the id the kernel holds."""
    source, twin = many_chunks
    other, other_twin, _ = raw_volume
    data, point = tmp_path / "data", tmp_path / "m"
    for name, dataset in (("a", source), ("b", source), ("c", other)):
        shutil.copytree(dataset, data / name)
    point.mkdir()
    log = tmp_path / "shardfs.log"
    systemd = Systemd(tmp_path / "notify")
    keeper_path = tmp_path / "keeper.sock"
    env = dict(os.environ)
    if carrier == "systemd":
        command = [*SHARDFS, "mount", "--foreground", str(data), str(point), "--log-file", str(log)]
    else:
        command = [*SHARDFS, "mount", str(data), str(point), "--log-file", str(log), "--log-level", "info"]
        command += ["-o", f"keeper={keeper_path}"]
    first: subprocess.Popen[str] | None = None
    after: Launch | None = None
    daemons: list[int] = []
    try:
        if carrier == "systemd":
            first = systemd.start(command, env).go()
            systemd.until("READY=1")
            after = systemd.start(command, env)
        else:
            subprocess.run(command, check=True, timeout=PATIENCE, capture_output=True)
            after = Launch(command, env)
        daemons.append(stats_socket.ask(point)[0])
        names = sorted(os.listdir(twin / SCALE))
        assert (point / "a" / SCALE / names[0]).read_bytes() == (twin / SCALE / names[0]).read_bytes()
        held = open(point / "b" / SCALE / names[1], "rb")  # noqa: SIM115 (read by the daemon after)
        assert os.fstat(held.fileno()).st_ino & PACKED
        _killed_and_replaced(daemons[0], after, systemd if carrier == "systemd" else None)
        daemons.append(stats_socket.ask(point)[0])
        assert "a kept connection taken up" in log.read_text()
        third = sorted(os.listdir(other_twin / SCALE))[1]
        assert (point / "c" / SCALE / third).read_bytes() == (other_twin / SCALE / third).read_bytes()
        with held:
            assert held.read() == (twin / SCALE / names[1]).read_bytes()
    finally:
        if after is not None and after.process.stdin is not None and not after.process.stdin.closed:
            after.process.kill()  # never started: it would start once this process's end closes its stdin
        _take_down(point, daemons, first, systemd, keeper_path)


def _take_down(
    point: Path, daemons: list[int], first: subprocess.Popen[str] | None, systemd: Systemd, keeper_path: Path
) -> None:  # fmt: skip
    """Whatever a test of a replaced daemon left: the mount, its daemons (the first one waited for, if the test
    started it), the notify socket and the keeper."""
    with contextlib.suppress(OSError):
        unmount(point, lazy=True)
    for pid in daemons:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if first is not None:
        first.wait(PATIENCE)
    systemd.close()
    if keeper_path.exists():
        with contextlib.suppress(OSError):
            os.kill(peer_pid(keeper_path), signal.SIGKILL)


def _killed_and_replaced(pid: int, after: Launch, systemd: Systemd | None) -> None:
    """The daemon pid killed, and the one after started: by systemd (once READY), or by hand for the keeper."""
    os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.01)
    if systemd is not None:
        after.go()
        systemd.until("READY=1")
    else:
        assert after.go().wait(timeout=PATIENCE) == 0, after.process.stderr.read()
