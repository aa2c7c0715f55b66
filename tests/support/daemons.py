"""Finding a mount's daemon and waiting on it: its process, a Unix socket's listener, whether a pid lives,
what its cache holds and its memory, and a lock on what the whole machine shares."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from tests.support.cli import scrape

REPO = Path(__file__).resolve().parents[2]


def daemon_of(mountpoint: Path) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        if str(mountpoint) in (proc.info["cmdline"] or []) and "mount" in proc.info["cmdline"]:
            return proc
    raise AssertionError(f"no daemon serves {mountpoint}")


def wait_until(condition: Callable[[], bool], seconds: float = 60) -> None:
    """Wait for condition, polling; the ceiling is one only a hang reaches, never a speed target."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def peer_pid(path: Path, kind: int = socket.SOCK_SEQPACKET) -> int:
    """The pid of the process listening at a Unix socket (a keeper's, by default)."""
    with socket.socket(socket.AF_UNIX, kind) as conn:
        conn.connect(str(path))
        return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


def alive(pid: int) -> bool:
    """Whether pid still runs (not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], seconds: float = 60) -> bool:
    """Whether condition holds within seconds, polling: for tests that assert it with a message of their own."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stats(point: Path) -> str:
    """The daemon's figures, as `shardfs stats --prometheus` prints them."""
    stats = [sys.executable, "-m", "shardfs", "stats", "--prometheus", point]
    return subprocess.run(stats, check=True, capture_output=True, text=True).stdout


def cache_held(point: Path) -> int:
    """Bytes the mount's cache counts as held, as `shardfs stats` reads them from the daemon."""
    text = _stats(point)
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith("shardfs_cache_bytes "))))


def remote_requests(point: Path) -> Counter[str]:
    """Requests the mount's daemon has sent to its source so far, by kind (head, get, list), as `shardfs stats`
    reads them."""
    figures = scrape(_stats(point))
    sent: Counter[str] = Counter()
    for (name, labels), value in figures.items():
        if name == "shardfs_remote_requests_total":
            sent[dict(labels)["request"]] += int(value)
    return sent


def peak_and_now_kib(pid: int) -> tuple[int, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]), int(status["VmRSS"].split()[0])


@contextlib.contextmanager
def machine_lock(path: Path, seconds: float = 600, shared: bool = False) -> Iterator[None]:
    """Held while a test changes path, which the whole machine shares: another suite (a second copy of the
    tree, run at once) or another worker waits for it. shared: held by tests that count on what path would
    change staying as it is, any number at once. The ceiling is one only a hang reaches."""
    with open(f"/run/lock/shardfs-tests-{str(path).strip('/').replace('/', '-')}", "w") as lock:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(lock, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{path}: another suite held it for {seconds:.0f} s"
                time.sleep(0.2)
        yield
