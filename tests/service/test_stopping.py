"""Ctrl-C in `shardfs mount -f` while a remote request hangs: the process stops at once, unmounted, and says
what it leaves waiting. The server is tests/support/http_server.py's RangeServer on loopback, made to hang. Ctrl-C of a
mount in use names the processes it is detached under. A detached `shardfs mount` passes Ctrl-C on to its daemon,
and says the same."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.support.cli import SHARDFS
from tests.support.daemons import wait_until
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


# The hung request is given --timeout 600: a process that waited on it would take ten minutes. Stopping "at
# once" is stopping before this ceiling, which no load reaches; the last words show it did not wait.
HUNG = "600"
PROMPT = 60.0


# Run first in the child: SIGINT's default action back, then shardfs in its place (exec keeps it). A suite
# started in the background (`&`, nohup) inherits SIGINT ignored, and Python leaves an ignored SIGINT ignored:
# Ctrl-C would never reach the daemon, and the test would fail as if it were slow.
WITH_CTRL_C = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.fixture
def server(raw_volume: tuple[Path, Path, np.ndarray]) -> Iterator[RangeServer]:
    with RangeServer(raw_volume[0]).running() as s:
        yield s


def run(*args: str | Path) -> subprocess.Popen[str]:
    """`shardfs ARGS` as a terminal runs it, Ctrl-C delivered whatever this process ignores."""
    return subprocess.Popen(
        [SHARDFS[0], "-c", WITH_CTRL_C, *SHARDFS[1:], *map(str, args)], stderr=subprocess.PIPE, text=True
    )


def mount_f(source: str | Path, point: Path, *options: str) -> subprocess.Popen[str]:
    return run("mount", "-f", source, point, *options)


def interrupt(proc: subprocess.Popen[str]) -> float:
    """Send SIGINT; the seconds until the process exited (killed at PROMPT, and the test fails)."""
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=PROMPT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return time.monotonic() - start


def test_ctrl_c_while_the_source_is_opened_stops_at_once(server, tmp_path) -> None:
    """The server hangs from the first request: the mount waits on its HEADs (zarr.json and info, asked at
    once) when Ctrl-C comes."""
    point = tmp_path / "m"
    point.mkdir()
    server.hang = True
    proc = mount_f(server.url, point, "--timeout", HUNG)
    try:
        wait_until(lambda: server.in_flight > 1)
        took = interrupt(proc)
        err = proc.stderr.read()
        assert took < PROMPT, f"{took:.1f} s; {err}"
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert f"stopping: 2 requests still waiting on the source (the oldest: head {server.url}/" in err, err
        assert not os.path.ismount(point)
    finally:
        proc.kill()


def test_ctrl_c_of_a_detached_mount_while_the_source_is_opened_says_what_waited(server, tmp_path) -> None:
    """Without -f, the daemon (in a session of its own, which the terminal's Ctrl-C does not reach) opens the
    source while `shardfs mount` waits for it: Ctrl-C is passed on, the daemon ends, and the terminal is told
    what was waiting, as -f tells it."""
    point, log = tmp_path / "m", tmp_path / "shardfs.log"
    point.mkdir()
    server.hang = True
    proc = run("mount", server.url, point, "--timeout", HUNG, "--log-file", log)
    try:
        wait_until(lambda: server.in_flight > 1)
        daemon = psutil.Process(proc.pid).children()
        took = interrupt(proc)
        err = proc.stderr.read()
        assert took < PROMPT, f"{took:.1f} s; {err}"
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert f"shardfs: stopping: 2 requests still waiting on the source (the oldest: head {server.url}/" in err, err
        assert not psutil.wait_procs(daemon, timeout=PROMPT)[1], "the daemon was left running"
        assert "event=stopping" in log.read_text()
        assert not os.path.ismount(point)
    finally:
        proc.kill()


def test_ctrl_c_with_a_reader_stuck_unmounts_at_once(server, raw_volume, tmp_path) -> None:
    """Mounted, a reader's chunk waits on the hung server when Ctrl-C comes: the mount goes, the process
    ends, and its last words name what it left waiting."""
    _, twin, _ = raw_volume
    point = tmp_path / "m"
    point.mkdir()
    proc = mount_f(server.url, point, "--timeout", HUNG)
    reader = None
    try:
        wait_until(lambda: os.path.ismount(point))
        server.hang = True
        name = sorted(p.name for p in (twin / "4_4_40").iterdir())[0]
        reader = subprocess.Popen(["cat", str(point / "4_4_40" / name)], stdout=subprocess.DEVNULL)
        wait_until(lambda: server.in_flight > 0)
        assert reader.poll() is None
        took = interrupt(proc)
        err = proc.stderr.read()
        assert took < PROMPT, f"{took:.1f} s; {err}"
        assert not os.path.ismount(point)
        assert "event=stopping" in err and "stopping: 1 request still waiting on the source" in err, err
    finally:
        proc.kill()
        if reader is not None:
            reader.kill()


def test_ctrl_c_of_a_mount_in_use_names_who_uses_it(raw_volume, tmp_path) -> None:
    """A shell's working directory inside: Ctrl-C detaches the mount all the same (it must end a daemon whose
    readers hang), and says which processes now get ENOTCONN, as `shardfs unmount` names them when it refuses."""
    point = tmp_path / "m"
    point.mkdir()
    proc = mount_f(raw_volume[0], point)
    inside = None
    try:
        wait_until(lambda: os.path.ismount(point))
        inside = subprocess.Popen(["sleep", "600"], cwd=point / "4_4_40")
        wait_until(lambda: os.readlink(f"/proc/{inside.pid}/cwd") == str(point / "4_4_40"))
        took = interrupt(proc)
        err = proc.stderr.read()
        assert took < PROMPT and proc.returncode == 0, err
        assert not os.path.ismount(point)
        assert f"Ctrl-C: {point} is in use by pid {inside.pid} (sleep: working directory): detached anyway" in err, err
    finally:
        proc.kill()
        if inside is not None:
            inside.kill()
