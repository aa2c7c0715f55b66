"""The keeper's protocol (shardfs/service/keeper.py) between processes: descriptors kept, taken back as the same
open file, dropped, refused to another user; a kept /dev/fuse whose mount ends is dropped by the keeper."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfs.errors import ServiceError
from shardfs.service import keeper


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
        keeper._ask(keeper_at, "STEAL m")


def test_a_second_keeper_at_the_same_socket_is_refused(keeper_at) -> None:
    with pytest.raises(ServiceError, match="already answers"):
        keeper.Keeper(keeper_at)


def test_another_user_is_not_served(public_tmp, other_user) -> None:
    """A /dev/fuse descriptor answers for the filesystem: another user must not take it. The socket is left
    reachable here (a directory open to all) to show the keeper's own check refusing, not the directory's."""
    for path in running_keeper(public_tmp / "keeper.sock"):
        fd = os.memfd_create("secret")
        keeper.keep(path, "m", [fd])
        run = subprocess.run(
            [*other_user, "tests.keeper_probe", str(path), "m"], capture_output=True, text=True, timeout=120
        )
        assert run.stdout.startswith("refused:"), run
        assert len(keeper.take(path, "m")) == 1  # and root's own requests are still served
