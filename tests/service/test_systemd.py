"""The committed unit under a real systemd: systemd 252 (Debian 12) as PID 1 of a container on this machine
(tests/support/systemd_machine.py), shardfs and the unit installed as the README says, a tensorstore volume mounted by
`systemctl enable --now`. Eight readers checksum every file of a scale, round and round, through the kernel,
while the daemon is killed (SIGKILL), handed over (SIGUSR2) and restarted (`systemctl restart`) with a file
held open: no read fails or reads a wrong byte, the mount is never gone (one device throughout) and the held
file reads on. A connection detached from its mountpoint is never taken up (the unit would be active with
nothing mounted), and `systemctl stop` leaves nothing: no mount, no process, an empty store, no connection."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.systemd_machine import Machine, booted

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.systemd]


UNIT = "shardfs@vol.service"
POINT = "/mnt/vol"
SCALE = "4_4_40"
READERS = 8
PATIENCE = 120.0  # seconds: only a hang waits this long
SLOW = 0.05  # seconds: a read that took longer is reported with its times (the gaps across replacements)

# A reader: reads every file of its list round and round, each time from the daemon (the file's pages dropped
# once read), checks it against the twin, and prints a JSON summary: reads, errors and wrong files (name and
# when), and the reads slower than SLOW (start and end, CLOCK_MONOTONIC). It ends once the file argv[3] exists
# and it has read every file at least once; a read after that file appeared is always made (so what the
# mount answers then is seen, whatever the machine's load). With argv[4] = "hold": one file opened once and
# read through the same descriptor throughout.
READER = """
import json, os, random, sys, time
mount, twin, stop, mode, slow = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
names = sorted(os.listdir(twin))
expected = {n: open(os.path.join(twin, n), "rb").read() for n in names}
random.Random(os.getpid()).shuffle(names)
out = {"reads": 0, "errors": [], "wrong": [], "slow": []}
held = os.open(os.path.join(mount, names[0]), os.O_RDONLY) if mode == "hold" else None
i, last = 0, False
while not last:
    last = os.path.exists(stop) and (held is not None or i >= len(names))
    name = names[0] if held is not None else names[i % len(names)]
    start = time.monotonic()
    try:
        fd = held if held is not None else os.open(os.path.join(mount, name), os.O_RDONLY)
        try:
            data = os.pread(fd, 1 << 20, 0)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            if held is None:
                os.close(fd)
        if data != expected[name]:
            out["wrong"].append([name, start])
    except OSError as e:
        out["errors"].append([name, e.errno, start])
    end = time.monotonic()
    if end - start > slow:
        out["slow"].append([start, end])
    out["reads"] += 1
    i += 1
    if held is not None:
        time.sleep(0.01)
print(json.dumps(out))
"""


# The pids of shardfs daemons in the machine (its own command line holds no NUL, so it never matches).
DAEMONS = """
import os

for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if b"mount\\0--foreground" in open(f"/proc/{pid}/cmdline", "rb").read():
            print(pid)
    except OSError:
        pass
"""


def fresh_start_count(machine: Machine) -> None:
    """systemd gives up on a unit started 5 times in 10 s (StartLimitBurst=): the tests replace its daemon
    faster than anyone would, so each begins with the count at 0 (`reset-failed` resets it)."""
    machine.run("systemctl", "reset-failed", UNIT)


@dataclass
class Readers:
    """Reader processes on the machine's mount, read from this one through /proc/LEADER/root."""

    machine: Machine
    twin: Path
    stop: Path
    count: int = READERS
    hold: int = 0
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def __enter__(self) -> Readers:
        self.stop.unlink(missing_ok=True)
        mount = str(self.machine.path(f"{POINT}/{SCALE}"))
        modes = ["read"] * self.count + ["hold"] * self.hold
        command = [sys.executable, "-c", READER, mount, str(self.twin), str(self.stop)]
        self.processes = [
            subprocess.Popen([*command, mode, str(SLOW)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for mode in modes
        ]
        return self

    def results(self) -> list[dict]:
        """Stop them, and what each saw (the readers first, then the holders)."""
        self.stop.touch()
        out = []
        for process in self.processes:
            printed, errors = process.communicate(timeout=PATIENCE)
            assert process.returncode == 0, errors
            out.append(json.loads(printed))
        return out

    def __exit__(self, *_: object) -> None:
        self.stop.touch()
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=PATIENCE)
            if process.poll() is None:
                process.kill()


class MountWatch:
    """The machine's mount table, looked at every 10 ms from a thread: every device seen at POINT (None: gone)."""

    def __init__(self, machine: Machine) -> None:
        self.machine, self.seen = machine, [machine.mounted(POINT)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            device = self.machine.mounted(POINT)
            if device != self.seen[-1]:
                self.seen.append(device)

    def __enter__(self) -> MountWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, many_chunks: tuple[Path, Path]) -> Iterator[Machine]:
    """The machine, the volume's unit enabled and started as the README says."""
    work = tmp_path_factory.mktemp("systemd")
    with booted(f"shardfs-test-{os.getpid()}", work, {many_chunks[0]: "/data/vol"}) as machine:
        conf = f"SOURCE=/data/vol\nMOUNTPOINT={POINT}\nOPTIONS=cache_size=64M\n"
        machine.run("install", "-D", "-m", "644", "/dev/stdin", "/etc/shardfs/vol.conf", stdin=conf)
        machine.run("mkdir", "-p", POINT)
        machine.run("systemctl", "daemon-reload")
        machine.run("systemctl", "enable", "--now", UNIT)
        yield machine


def show(machine: Machine, *properties: str) -> dict[str, str]:
    shown = machine.run("systemctl", "show", UNIT, *(f"--property={p}" for p in properties)).stdout
    return dict(line.split("=", 1) for line in shown.splitlines())


def replaced(machine: Machine, *command: str) -> float:
    """Run command (which replaces the daemon) in the machine, and wait until another daemon serves: its pid
    is the unit's main one and the unit is active. Returns when the command began (CLOCK_MONOTONIC)."""
    before = show(machine, "MainPID")["MainPID"]
    began = time.monotonic()
    machine.run(*command)
    while (now := show(machine, "MainPID", "ActiveState")) and (
        now["MainPID"] in (before, "0") or now["ActiveState"] != "active"
    ):  # fmt: skip
        assert time.monotonic() < began + PATIENCE, f"{command}: no daemon came back: {journal(machine)}"
        time.sleep(0.02)
    return began


def journal(machine: Machine) -> str:
    return machine.run("journalctl", "--unit", UNIT, "--output=cat", "--no-pager").stdout


def gaps(results: list[dict], began: list[float]) -> list[float]:
    """For each replacement (the time it began), the longest read that was under way across it."""
    longest = [0.0] * len(began)
    for result in results:
        for start, end in result["slow"]:
            for i, at in enumerate(began):
                if start <= at + PATIENCE and end >= at and (i + 1 == len(began) or start < began[i + 1]):
                    longest[i] = max(longest[i], end - max(start, at))
    return longest


def test_kill_hand_over_and_restart_keep_the_mount_and_lose_no_read(machine, many_chunks, tmp_path) -> None:
    _, twin = many_chunks
    fresh_start_count(machine)
    taken_up = journal(machine).count("a kept connection taken up")
    events = {
        "kill -9": ["systemctl", "kill", "--kill-who=main", "--signal=SIGKILL", UNIT],
        "hand-over": ["systemctl", "kill", "--kill-who=main", "--signal=SIGUSR2", UNIT],
        "systemctl restart": ["systemctl", "restart", UNIT],
    }
    device = machine.mounted(POINT)
    assert device is not None
    with MountWatch(machine) as watch, Readers(machine, twin / SCALE, tmp_path / "stop", hold=1) as readers:
        time.sleep(1)  # every reader under way
        began = []
        for command in events.values():
            began.append(replaced(machine, *command))
            time.sleep(1)  # the new daemon serves a while
        results = readers.results()
    errors = [e for r in results for e in r["errors"]]
    wrong = [w for r in results for w in r["wrong"]]
    assert not errors and not wrong, (errors, wrong, journal(machine))
    assert all(r["reads"] >= 2048 for r in results[:READERS])  # each read every file, at least once
    assert watch.seen == [device], watch.seen  # never unmounted, never another connection
    assert journal(machine).count("a kept connection taken up") == taken_up + len(events)
    waited = dict(zip(events, gaps(results, began), strict=True))
    print(f"longest read across each replacement: {waited}")
    assert max(waited.values()) < PATIENCE


def test_a_connection_no_longer_mounted_is_let_go_and_the_mount_made_afresh(machine, many_chunks, tmp_path) -> None:
    """A mount detached by hand with a file open on it (`umount -l`): its connection lives on, kept in the store.
    The next daemon (here after `systemctl restart`) must not serve it, or the unit would be active with
    nothing mounted: it lets it go (the file held then fails, ENOTCONN) and mounts afresh."""
    _, twin = many_chunks
    fresh_start_count(machine)
    with Readers(machine, twin / SCALE, tmp_path / "stop", count=0, hold=1) as holder:
        time.sleep(0.5)
        machine.run("umount", "--lazy", POINT)
        assert machine.mounted(POINT) is None
        replaced(machine, "systemctl", "restart", UNIT)
        (held,) = holder.results()
    assert machine.mounted(POINT) is not None
    assert show(machine, "ActiveState", "NFileDescriptorStore") == {
        "ActiveState": "active",
        "NFileDescriptorStore": "2",
    }
    name = sorted(p.name for p in (twin / SCALE).iterdir())[7]
    assert machine.path(f"{POINT}/{SCALE}/{name}").read_bytes() == (twin / SCALE / name).read_bytes()
    assert f"is no longer mounted at {POINT}" in journal(machine)
    assert held["errors"] and {e[1] for e in held["errors"]} == {errno.ENOTCONN}, held  # the connection ended


def test_a_stop_leaves_nothing(machine, many_chunks, tmp_path) -> None:
    """With a file held open: no mount, no daemon, nothing in the store, and the connection ended: the held file
    fails with ENOTCONN, which the kernel answers once no descriptor of the connection is left anywhere."""
    _, twin = many_chunks
    fresh_start_count(machine)
    try:
        with Readers(machine, twin / SCALE, tmp_path / "stop", count=0, hold=1) as holder:
            time.sleep(0.5)
            machine.run("systemctl", "stop", UNIT)
            assert machine.mounted(POINT) is None
            left = show(machine, "MainPID", "ActiveState", "NFileDescriptorStore")
            assert left == {"MainPID": "0", "ActiveState": "inactive", "NFileDescriptorStore": "0"}, left
            assert not machine.run("python3", "-c", DAEMONS).stdout.split()  # no daemon left anywhere
            (held,) = holder.results()
        assert held["errors"] and {e[1] for e in held["errors"]} == {errno.ENOTCONN}, held
        assert f"unmounted {POINT}" in journal(machine)
    finally:
        machine.run("systemctl", "start", UNIT)
