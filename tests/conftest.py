"""Mounts for the tests: always through the real CLI, the kernel and a detached daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from shardfs.service.daemon import MountError, unmount
from tests.support import peers
from tests.support.cli import Mount, shardfs
from tests.support.datasets import SHARDING, write_small_volume
from tests.support.peers import write_zarr_python
from tests.support.users import BIG, USER


@pytest.fixture
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Mount]]:
    """mount(source, *options) -> Mount, unmounted at teardown."""
    made: list[Path] = []

    def make(source: Path, *options: str, under: Path | None = None) -> Mount:
        """under: a directory to mount in (one other users can reach, for tests of what they may do)."""
        where = tmp_path_factory.mktemp("mnt")
        point, log = where / "m", where / "shardfs.log"
        if under is not None:
            point = Path(tempfile.mkdtemp(prefix="m", dir=under))
            point.chmod(0o755)
        else:
            point.mkdir()
        shardfs("mount", source, point, "--log-file", log, *options)
        assert os.path.ismount(point), "mount returned before the mount was live"
        made.append(point)
        return Mount(point, log)

    yield make
    for point in made:
        deadline = time.monotonic() + 60
        while os.path.ismount(point):
            try:
                unmount(point)  # what `shardfs unmount` runs, without starting an interpreter for it
            except MountError:  # busy: a peer library in this process (tensorstore) may still be closing files
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.fixture(scope="session")
def user() -> tuple[int, int]:
    """(uid, gid) of an unprivileged user, created if missing."""
    # Parallel workers (and a second suite) may add it at once: the loser's useradd fails (exists, or the
    # passwd file locked), and the user is there once the winner's is done.
    add = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER]
    deadline = time.monotonic() + 60
    while subprocess.run(["id", "-u", USER], capture_output=True).returncode:
        assert time.monotonic() < deadline, f"{USER} could not be added: {' '.join(add)}"
        if subprocess.run(add, capture_output=True).returncode:
            time.sleep(0.2)
    uid, gid = (int(subprocess.run(["id", f, USER], capture_output=True, text=True).stdout) for f in ("-u", "-g"))
    return uid, gid


@pytest.fixture(scope="session")
def other_user(user: tuple[int, int]) -> list[str]:
    """The prefix that runs a module's main() as the unprivileged user (see tests/support/as_user.py): for what
    coreutils cannot do, such as binding a socket."""
    return [sys.executable, "-m", "tests.support.as_user", *map(str, user)]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME and no cloud variables: only what a test writes there can be found."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "GCE_")):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A directory every user can search, outside pytest's private temp root: a source under it is shared
    only as far as its own modes say."""
    path = Path(tempfile.mkdtemp(prefix="shardfs-public-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def many_chunks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source, unsharded twin) of a tensorstore volume of 2,048 raw chunks (scale `4_4_40`), for readers that
    go through every file while its daemon is replaced: a listing of them takes several READDIR requests, and
    each cold chunk one GET or more."""
    root = tmp_path_factory.mktemp("many-chunks")
    source, twin = root / "src", root / "twin"
    peers.write_tensorstore_volume(
        source, data_encoding="raw", size=(128, 128, 64), chunk=(8, 8, 8), voxel_offset=(0, 0, 0),
        extra_unsharded_scale=False, unsharded_twin=twin,
    )  # fmt: skip
    return source, twin


@pytest.fixture(scope="session")
def raw_volume(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """(source, unsharded twin, voxels): a tensorstore precomputed volume with raw chunk data, so a chunk's
    bytes lie in its shard as they are served (one range, one GET per chunk). Shared: tests copy it before
    changing it."""
    root = tmp_path_factory.mktemp("raw-volume")
    source, twin = root / "src", root / "twin"
    return source, twin, peers.write_tensorstore_volume(source, data_encoding="raw", unsharded_twin=twin)


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sharded volume; tensorstore writes the same data unsharded beside it, at `twin`. Shared: tests
    damage copies (`corrupted`)."""
    where = tmp_path_factory.mktemp("bad")
    data = np.random.default_rng(0).integers(0, 255, (64, 64, 16, 1), dtype=np.uint8)
    write_small_volume(where / "vol", data, SHARDING)
    write_small_volume(where / "twin", data, None)
    return where / "vol"


@pytest.fixture
def corrupted(pristine: Path, tmp_path: Path):
    def make(damage: Callable[[Path], None]) -> Path:
        root = tmp_path / "vol"
        shutil.copytree(pristine, root)
        damage(root / "1_1_1")
        return root

    return make


@pytest.fixture(scope="session")
def zarr_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """zarr-python 3's hierarchy (peers.write_zarr_python) and each array's contents. Shared: tests damage
    copies (`damaged`)."""
    root = tmp_path_factory.mktemp("zarr") / "brain.zarr"
    return root, write_zarr_python(root)


@pytest.fixture
def damaged(zarr_source, tmp_path):
    def make(edit: Callable[[Path], None]) -> Path:
        root = tmp_path / "brain.zarr"
        shutil.copytree(zarr_source[0], root)
        edit(root)
        return root

    return make


@pytest.fixture(scope="session")
def shared() -> Iterator[tuple[Path, dict[int, bytes]]]:
    """A key-value dataset any user may read, in a directory any user may search, and what it holds."""
    root = Path(tempfile.mkdtemp(prefix="shardfs-mounting-", dir="/tmp"))
    root.chmod(0o755)
    values = {1: np.random.default_rng(1).bytes(BIG), 2: b"two", 3: b"three"}
    peers.write_tensorstore_kv(root / "kv", values)
    for path in [root / "kv", *(root / "kv").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root / "kv", values
    shutil.rmtree(root, ignore_errors=True)


# The modules that take longest, begun first: parallel workers (scripts/test) take a module at a time, and
# one begun last would run on alone after the others are done.
SLOW_FIRST = [
    *("test_memory.py", "test_fuzz.py", "test_bounds.py", "test_fuse_session.py", "test_views.py"),
    *("test_zarr.py", "test_service.py", "test_remote_edges.py", "test_remote_http.py", "test_restart.py"),
    "test_remote_bounds.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return SLOW_FIRST.index(item.path.name) if item.path.name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: within a module, the order stays as written


# What a fixture needs of the machine, which a test that takes it must declare (pyproject.toml's markers).
NEEDS = {"mount": "kernel", "user": "root", "other_user": "root"}


def pytest_itemcollected(item: pytest.Item) -> None:
    for fixture, marker in NEEDS.items():
        if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None:
            raise pytest.UsageError(f"{item.nodeid} takes `{fixture}` and is not marked `{marker}`")
