"""Mounts for the tests: always through the real CLI, the kernel and a detached daemon."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SHARDFS = [sys.executable, "-m", "shardfs"]
REPO = Path(__file__).resolve().parent.parent


def shardfs(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFS, *map(str, args)], capture_output=True, text=True, timeout=60, check=check)


def assert_eio(path: Path) -> None:
    """Reading path fails with EIO: the answer for corrupt data, which must not be ENOENT or garbage."""
    with pytest.raises(OSError) as e:
        path.read_bytes()
    assert e.value.errno == errno.EIO


class Mount:
    def __init__(self, path: Path, log: Path) -> None:
        self.path, self.log = path, log

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Mount]]:
    """mount(source, *options) -> Mount, unmounted at teardown."""
    made: list[Path] = []

    def make(source: Path, *options: str) -> Mount:
        where = tmp_path_factory.mktemp("mnt")
        point, log = where / "m", where / "shardfs.log"
        point.mkdir()
        shardfs("mount", source, point, "--log-file", log, *options)
        assert os.path.ismount(point), "mount returned before the mount was live"
        made.append(point)
        return Mount(point, log)

    yield make
    for point in made:
        if os.path.ismount(point):
            shardfs("unmount", point)


@pytest.fixture(scope="session")
def other_user() -> list[str]:
    """The prefix that runs a module's main() as an unprivileged local user. The user is made if missing and
    left there: other test sessions on the machine may be using it at the same time."""
    name = "shardfs-test"
    if subprocess.run(["id", "-u", name], capture_output=True, check=False).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    ids = [
        subprocess.run(["id", flag, name], capture_output=True, text=True, check=True).stdout.strip()
        for flag in ("-u", "-g")
    ]
    return [sys.executable, "-m", "tests.as_user", *ids]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every local user can reach (pytest's own are closed to all but root)."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="shardfs-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
