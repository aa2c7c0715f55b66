"""A Debian 12 machine with systemd 252 as PID 1, booted in a systemd-nspawn container on this one: the unit's
tests and scripts/systemd_restarts.py run it under a real systemd, installed as the README says.

The OS tree (debootstrap from Debian's mirror, about two minutes) is made once per machine and kept under
/var/cache; every boot lays a tmpfs over it (`--volatile=overlay`), so a run leaves it as it was. shardfs goes
in as the README installs it (a venv in /opt/shardfs, `pip install`), from wheels built here, so that nothing
is fetched inside. nspawn runs with `--keep-unit --register=no` (this machine's systemd, if any, is not asked)
and from a cgroup of its own, under which it makes its `payload/` and `supervisor/`; they go with the machine.
What the machine mounts is reached from here through /proc/LEADER/root (`path()`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.daemons import REPO, machine_lock

SUITE = "bookworm"  # Debian 12: systemd 252, the oldest systemd whose behaviour the unit relies on
PACKAGES = ("systemd", "dbus", "python3", "python3-venv", "fuse3")
CACHE = Path("/var/cache/shardfs-tests")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PATIENCE = 120.0  # seconds: only a hang waits this long
CGROUPS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def image() -> Path:
    """The OS tree, made if this machine has none yet (a directory renamed into place once whole)."""
    key = hashlib.sha256(" ".join((SUITE, *PACKAGES)).encode()).hexdigest()[:12]
    root = CACHE / f"{SUITE}-{key}"
    if root.is_dir():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with machine_lock(CACHE, seconds=900):
        if root.is_dir():
            return root
        building = CACHE / f"building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(building)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            raise RuntimeError(f"debootstrap failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        building.rename(root)
    return root


def wheels(where: Path) -> Path:
    """shardfs and everything it installs, as wheels built here (pip's cache makes this quick after setup)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(where), str(REPO)],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    return where


class Machine:
    """One booted machine. binds: host path → path inside (read-only); run() runs a command in it."""

    def __init__(self, name: str, log: Path, binds: dict[Path, str]) -> None:
        self.name, self.log, self.binds = name, log, binds
        self.cgroups = [base / name for base in CGROUPS if (base / "cgroup.procs").exists()][:2]
        self.leader = 0
        self._nspawn: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Machine:
        for cgroup in self.cgroups:
            cgroup.mkdir(exist_ok=True)
        command = [
            "systemd-nspawn", "--boot", f"--directory={image()}", f"--machine={self.name}", "--register=no",
            "--keep-unit", "--volatile=overlay", "--bind=/dev/fuse", "--console=passive",
            *(f"--bind-ro={host}:{inside}" for host, inside in self.binds.items()),
        ]  # fmt: skip
        with open(self.log, "wb") as out:
            self._nspawn = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=self._enter_cgroups
            )  # fmt: skip
        try:
            self.leader = self._wait_for_leader()
            self._wait_until_up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _enter_cgroups(self) -> None:
        for cgroup in self.cgroups:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def _wait_for_leader(self) -> int:
        """The machine's PID 1 (systemd), as this machine numbers it: nspawn's child, once it has exec'd."""
        assert self._nspawn is not None
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            assert self._nspawn.poll() is None, f"systemd-nspawn ended: {self.log.read_text()}"
            for task in Path(f"/proc/{self._nspawn.pid}/task").iterdir():
                for child in (task / "children").read_text().split():
                    with contextlib.suppress(OSError):
                        if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                            return int(child)
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: systemd never started: {self.log.read_text()}")

    def _wait_until_up(self) -> None:
        """Until systemd says the machine is up (`--wait` waits for the boot; before systemd listens, it fails)."""
        deadline = time.monotonic() + PATIENCE
        while (done := self.run("systemctl", "is-system-running", "--wait", check=False)).stdout.strip() not in (
            "running", "degraded",
        ):  # fmt: skip
            assert time.monotonic() < deadline, f"{self.name}: {done.stdout}{done.stderr}{self.log.read_text()}"
            time.sleep(0.1)

    def run(
        self, *command: str, check: bool = True, timeout: float = PATIENCE, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """command inside the machine (all its namespaces), with a clean environment."""
        done = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "env", "-i", f"PATH={PATH}", *command],
            input=stdin, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"{' '.join(command)}: {done.returncode}: {done.stdout}{done.stderr}"
        return done

    def path(self, inside: str) -> Path:
        """A path inside the machine, as reached from here."""
        return Path(f"/proc/{self.leader}/root{inside}")

    def mounted(self, point: str) -> str | None:
        """The device (0:N) of the topmost mount at point inside the machine, from its mount table."""
        device = None
        for line in Path(f"/proc/{self.leader}/mountinfo").read_text().splitlines():
            fields = line.split(" - ")[0].split()
            if fields[4] == point:
                device = fields[2]
        return device

    def install_shardfs(self, wheel_dir: str) -> None:
        """As the README's "Run as a service" says, from the wheels at wheel_dir (inside) instead of PyPI."""
        self.run("python3", "-m", "venv", "/opt/shardfs")
        self.run("/opt/shardfs/bin/pip", "install", "-q", "--no-index", "--find-links", wheel_dir, "shardfs")
        self.run("ln", "-s", "/opt/shardfs/bin/shardfs", "/usr/local/bin/shardfs")

    def __exit__(self, *_: object) -> None:
        if self._nspawn is not None and self._nspawn.poll() is None:
            self._nspawn.terminate()  # nspawn asks the machine's systemd to power off
            try:
                self._nspawn.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._nspawn.kill()
                self._nspawn.wait(timeout=60)
        for cgroup in self.cgroups:
            _remove_cgroup(cgroup)


def _remove_cgroup(cgroup: Path) -> None:
    """A cgroup and those nspawn made under it, deepest first, once their processes are gone."""
    if not cgroup.is_dir():
        return
    for below in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            below.rmdir()
    with contextlib.suppress(OSError):
        cgroup.rmdir()


@contextlib.contextmanager
def booted(name: str, workdir: Path, binds: dict[Path, str]) -> Iterator[Machine]:
    """A machine with shardfs installed from this checkout, and its unit, as the README says."""
    built = wheels(workdir / "wheels")
    with Machine(name, workdir / "nspawn.log", {built: "/wheels", REPO: "/src", **binds}) as machine:
        machine.install_shardfs("/wheels")
        machine.run("install", "-m", "644", "/src/systemd/shardfs@.service", "/etc/systemd/system/")
        yield machine
