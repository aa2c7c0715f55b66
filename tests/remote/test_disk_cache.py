"""`--cache-dir` as a local user or a broken disk could make it: a volume written by tensorstore, served over
loopback, mounted by root with `allow_other` and read through the kernel by an unprivileged user. A first
mount fills the cache; the entries are then changed on disk as root; a second mount must serve the twin's
bytes anyway, promptly, fetching what it cannot trust again. A directory others could write is refused; a
directory that cannot be written costs the cache, never a read."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from shardfs.stores.disk_cache import HEADER, DiskCache
from tests.support import peers
from tests.support.cli import Mount, shardfs
from tests.support.daemons import daemon_of
from tests.support.http_server import RangeServer
from tests.support.users import as_user

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]


READ_SECONDS = 30  # one `cat` of every chunk: a read that hangs fails the test instead of the suite
MEMORY_HEADROOM = 1 << 30  # the most the daemon's address space may grow while a test reads
SECRET = b"root-only secret 7f3a9c "


@pytest.fixture
def volume(raw_volume: tuple[Path, Path, np.ndarray]) -> tuple[Path, Path]:
    """All full chunks the same size: entries of one length can be swapped for each other."""
    return raw_volume[0], raw_volume[1]


@pytest.fixture
def server(volume) -> Iterator[RangeServer]:
    with RangeServer(volume[0]).running() as s:
        yield s


def chunks(twin: Path) -> list[str]:
    return sorted(p.name for p in (twin / "4_4_40").iterdir())


def read_as(user: tuple[int, int], m: Mount, names: list[str]) -> bytes:
    """Every chunk named, through the kernel, as the unprivileged user, within READ_SECONDS."""
    drop = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
    paths = [str(m.path / "4_4_40" / n) for n in names]
    done = subprocess.run([*drop, "cat", *paths], capture_output=True, timeout=READ_SECONDS)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:] + "\ndaemon log:\n" + m.log_text()[-4000:]
    return done.stdout


def expected(twin: Path, names: list[str]) -> bytes:
    return b"".join((twin / "4_4_40" / n).read_bytes() for n in names)


def assert_same(got: bytes, want: bytes) -> None:
    """Equal bytes; else where they first differ (not a diff of 200 KB)."""
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        pytest.fail(f"{len(got)} bytes read, {len(want)} expected; they first differ at {first}")


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def full_chunk_entries(cache: Path) -> list[Path]:
    """The entries of full chunks: the most common size (edge chunks are clipped, indexes smaller)."""
    sizes = {p: p.lstat().st_size for p in entries(cache)}
    common, _ = Counter(sizes.values()).most_common(1)[0]
    return [p for p, size in sizes.items() if size == common]


def fill(server: RangeServer, mount: Callable[..., Mount], cache: Path, names: list[str]) -> None:
    """A first mount that reads every chunk, so the cache holds all of them."""
    first = mount(server.url, "--cache-dir", cache)
    for name in names:
        (first.path / "4_4_40" / name).read_bytes()
    shardfs("unmount", first.path)


def shared_mount(server: RangeServer, mount: Callable[..., Mount], public_tmp: Path, cache: Path) -> Mount:
    """Root's mount every user reaches; its daemon may grow by at most MEMORY_HEADROOM, so that a cache
    entry that reads forever (/dev/zero) fails the test instead of the machine."""
    m = mount(server.url, "-o", "allow_other", "--cache-dir", cache, under=public_tmp)
    daemon = daemon_of(m.path)
    limit = daemon.memory_info().vms + MEMORY_HEADROOM
    resource.prlimit(daemon.pid, resource.RLIMIT_AS, (limit, limit))
    return m


def test_a_changed_entry_is_fetched_again_never_served(volume, server, mount, public_tmp, user, tmp_path) -> None:
    """Entries of the same length with other bytes (one byte flipped, or another chunk's whole entry) and
    entries one byte longer: each is detected, deleted and fetched from the source again, and written anew,
    so a third mount needs no GET but one a shard: the read of its shard index, whose answer names the
    version that the kept ranges are looked up by."""
    _, twin = volume
    names, cache = chunks(twin), tmp_path / "cache"
    fill(server, mount, cache, names)
    full = full_chunk_entries(cache)
    assert len(full) > 30
    originals = [p.read_bytes() for p in full]
    for i, path in enumerate(full):
        data = bytearray(originals[i])
        if i % 3 == 0:
            data[-1] ^= 0x01
        elif i % 3 == 1:
            data = bytearray(originals[i + 1 if i + 1 < len(full) else 0])  # another chunk's, same length
        else:
            data.append(0)
        path.write_bytes(data)
    before = server.gets(".shard")
    second = shared_mount(server, mount, public_tmp, cache)
    assert_same(read_as(user, second, names), expected(twin, names))
    assert server.gets(".shard") - before >= len(full)  # each damaged entry read from the source again
    assert "damaged" in second.log_text()
    shardfs("unmount", second.path)
    before = server.gets(), server.gets(".shard")
    third = shared_mount(server, mount, public_tmp, cache)
    assert_same(read_as(user, third, names), expected(twin, names))
    shards = len(list((volume[0] / "4_4_40").glob("*.shard")))
    assert (server.gets() - before[0], server.gets(".shard") - before[1]) == (shards, shards)


def as_root_only_secret(path: Path, secrets: Path) -> None:
    """path, a link to a file only root may read, of path's size: the bytes a reader must never see."""
    size = path.stat().st_size
    secret = secrets / path.name
    secret.write_bytes((SECRET * (size // len(SECRET) + 1))[:size])
    secret.chmod(0o600)
    path.unlink()
    path.symlink_to(secret)


def as_dev_zero(path: Path, _: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def as_fifo(path: Path, _: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


@pytest.mark.parametrize("swap", [as_root_only_secret, as_dev_zero, as_fifo], ids=["secret", "dev-zero", "fifo"])
def test_an_entry_swapped_for_a_link_or_fifo_is_never_followed(
    swap, volume, server, mount, public_tmp, user, tmp_path
) -> None:
    """An entry replaced by a link to a root-only file of the same size, a link to /dev/zero (which never
    ends) or a FIFO (which blocks whoever opens it): the user reads the twin's bytes, promptly, within a
    bounded daemon, and never the secret."""
    _, twin = volume
    names, cache, secrets = chunks(twin), tmp_path / "cache", tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    fill(server, mount, cache, names)
    swapped = full_chunk_entries(cache)
    for path in swapped:
        swap(path, secrets)
    try:
        m = shared_mount(server, mount, public_tmp, cache)
        got = read_as(user, m, names)
        assert SECRET not in got
        assert_same(got, expected(twin, names))
    finally:
        for path in swapped:  # a daemon stuck opening a FIFO (a regression) is let go, so teardown can unmount
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_renaming_the_directory_after_the_mount_changes_nothing(volume, server, mount, tmp_path) -> None:
    """The directory is opened once: moved away and replaced by a link to another directory while mounted,
    the mount keeps writing to the directory it opened, never where the link points."""
    _, twin = volume
    names, cache, elsewhere = chunks(twin), tmp_path / "cache", tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    m = mount(server.url, "--cache-dir", cache)
    half = len(names) // 2
    for name in names[:half]:
        (m.path / "4_4_40" / name).read_bytes()
    cache.rename(tmp_path / "moved")
    cache.symlink_to(elsewhere)
    held = len(entries(tmp_path / "moved"))
    for name in names[half:]:
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    assert list(elsewhere.iterdir()) == []
    assert len(entries(tmp_path / "moved")) > held  # what was read after is kept where the directory was opened


def other_users_dir(user: tuple[int, int], public_tmp: Path, mode: str) -> Path:
    """A directory the unprivileged user made first, where root is about to name it."""
    public_tmp.chmod(0o1777)  # as /tmp is
    path = public_tmp / "cache"
    made = as_user(user, "mkdir", "-m", mode, path)
    assert made.returncode == 0, made.stderr
    return path


def roots_dir(mode: int) -> Callable[[tuple[int, int], Path], Path]:
    def make(_: tuple[int, int], public_tmp: Path) -> Path:
        path = public_tmp / "cache"
        path.mkdir()
        path.chmod(mode)
        return path

    return make


def a_file(_: tuple[int, int], public_tmp: Path) -> Path:
    path = public_tmp / "cache"
    path.write_text("not a directory")
    return path


def a_link_to_roots_dir(user: tuple[int, int], public_tmp: Path) -> Path:
    """A link the user planted where root will name a directory, to a directory of root's."""
    target = public_tmp / "roots"
    target.mkdir(mode=0o700)
    public_tmp.chmod(0o1777)
    path = public_tmp / "cache"
    made = as_user(user, "ln", "-s", target, path)
    assert made.returncode == 0, made.stderr
    return path


REFUSED = {
    "others-0777": (lambda user, tmp: other_users_dir(user, tmp, "0777"), "owned by uid"),
    "others-0700": (lambda user, tmp: other_users_dir(user, tmp, "0700"), "owned by uid"),
    "root-0777": (roots_dir(0o777), "writable by other users (mode 0777)"),
    "root-0775": (roots_dir(0o775), "writable by other users (mode 0775)"),
    "root-1777": (roots_dir(0o1777), "writable by other users (mode 1777)"),
    "file": (a_file, "not a directory"),
    "link": (a_link_to_roots_dir, "symbolic link"),
}


@pytest.mark.parametrize("kind", REFUSED)
def test_a_directory_others_could_write_is_refused(kind, server, user, public_tmp, tmp_path) -> None:
    """Refused in one line naming --cache-dir, the directory and what is wrong, exit 2, nothing mounted
    and nothing written there."""
    make, why = REFUSED[kind]
    cache = make(user, public_tmp)
    point = tmp_path / "m"
    point.mkdir()
    done = shardfs("mount", server.url, point, "--cache-dir", cache, check=False)
    mounted = os.path.ismount(point)
    if mounted:  # a regression: not left mounted
        shardfs("unmount", point)
    assert done.returncode == 2 and not mounted, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"shardfs: --cache-dir {cache}: ") and why in lines[0], lines
    assert server.gets() == 0
    if cache.is_dir():
        assert list(cache.iterdir()) == []


def test_a_missing_directory_is_made_for_this_user_alone(volume, server, mount, tmp_path) -> None:
    _, twin = volume
    names, cache = chunks(twin), tmp_path / "new" / "cache"
    old = os.umask(0o022)  # the mount inherits it: mkdir's own mode would give 0755
    try:
        fill(server, mount, cache, names[:3])
    finally:
        os.umask(old)
    st = cache.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert entries(cache) and all(p.stat().st_mode & 0o777 == 0o600 for p in entries(cache))


def test_parts_left_by_a_dead_daemon_are_cleared(volume, server, mount, tmp_path) -> None:
    """A half-written entry left by a daemon that died (an hour old) is removed by the next mount, as it
    is counted by no budget; a fresh one (another daemon writing it now) is left alone."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    stale, fresh = cache / ".part-0123456789abcdef", cache / ".part-fedcba9876543210"
    stale.write_bytes(bytes(1 << 20))
    fresh.write_bytes(b"being written")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    fill(server, mount, cache, chunks(volume[1])[:1])
    assert not stale.exists() and fresh.exists()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """tmpfs(options) -> a new tmpfs of root's alone, mounted with those options; unmounted at teardown."""
    made: list[Path] = []

    def make(options: str) -> Path:
        point = tmp_path / f"tmpfs{len(made)}"
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode=0700,{options}", "tmpfs", point], check=True)
        made.append(point)
        return point

    yield make
    for point in made:
        if subprocess.run(["umount", point], capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", point], check=True)


@pytest.mark.parametrize(
    "options, error",
    [("size=1m,nr_inodes=4", errno.ENOSPC), ("size=8k", errno.ENOSPC), ("size=1m,ro", errno.EROFS)],
    ids=["no-inodes", "no-space", "read-only"],
)
def test_a_directory_that_cannot_be_written_costs_the_cache_not_the_read(
    options, error, volume, server, mount, tmpfs
) -> None:
    """A tmpfs out of inodes, out of space, or read-only: every read is right, the failure is logged once
    (naming --cache-dir and why), and no half-written entry is left behind."""
    _, twin = volume
    names = chunks(twin)
    cache = tmpfs(options.replace(",ro", ""))
    if options.endswith(",ro"):
        subprocess.run(["mount", "-o", "remount,ro", cache], check=True)
    m = mount(server.url, "--cache-dir", cache)
    for name in names:
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    shardfs("unmount", m.path)
    warnings = [line for line in m.log_text().splitlines() if "cannot write" in line]
    assert len(warnings) == 1, m.log_text()
    assert f"--cache-dir {cache}" in warnings[0] and os.strerror(error) in warnings[0]
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_a_rewritten_object_is_read_anew(mount, tmp_path) -> None:
    """An entry is tied to the object's version: the source rewritten (new files renamed over the old,
    so new ETags) between two mounts, the second mount serves the new bytes, not the kept old ones."""
    source, new, twin = tmp_path / "src", tmp_path / "new", tmp_path / "twin"
    peers.write_tensorstore_volume(source, data_encoding="raw", seed=0)
    peers.write_tensorstore_volume(new, data_encoding="raw", seed=1, unsharded_twin=twin)
    names, cache = chunks(twin), tmp_path / "cache"
    with RangeServer(source).running() as server:
        fill(server, mount, cache, names)
        for path in new.rglob("*"):
            if path.is_file():
                staged = source / f"{path.relative_to(new)}.new"
                staged.write_bytes(path.read_bytes())
                staged.rename(source / path.relative_to(new))
        m = mount(server.url, "--cache-dir", cache)
        for name in names:
            assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name


def test_eviction_drops_the_least_recently_used(tmp_path) -> None:
    """Ten entries fill the budget; the first is read again; an eleventh evicts down to 90%: the two least
    recently used go (the second and third written), the first, read since, and the newest stay."""
    value = bytes(1000)
    cache = DiskCache(tmp_path / "cache", 10 * (HEADER.size + len(value)))
    for i in range(10):
        cache.put(f"u{i}", ("etag", "v"), 0, len(value), value)
    assert cache.get("u0", ("etag", "v"), 0, len(value)) == value
    cache.put("u10", ("etag", "v"), 0, len(value), value)
    kept = [i for i in range(11) if cache.get(f"u{i}", ("etag", "v"), 0, len(value)) is not None]
    assert kept == [0, *range(3, 11)]
