"""A root mount with `allow_other` is a service every local user reaches. Nothing outside the source is ever
readable through it, no link is followed anywhere, and a file or directory is open exactly to the users the
source opens it to. Readers here are the kernel and an unprivileged user running coreutils, against a real
root mount; datasets are written by tensorstore and zarr-python."""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.support import peers
from tests.support.daemons import daemon_of
from tests.support.reading import denied
from tests.support.users import as_user, hold_directory

pytestmark = [pytest.mark.kernel, pytest.mark.root]


RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): swap two names atomically, as an attacker owning their directory can."""
    if _libc.renameat2(-100, bytes(a), -100, bytes(b), RENAME_EXCHANGE):
        raise OSError(ctypes.get_errno(), "renameat2", str(a))


@pytest.fixture
def secret(public_tmp: Path) -> Path:
    """A directory outside every source, root's alone, holding a file no user may read."""
    path = public_tmp / "secret"
    path.mkdir(mode=0o700)
    (path / "f").write_bytes(b"SECRET")
    (path / "f").chmod(0o600)
    return path


def test_links_are_not_followed_anywhere(public_tmp, secret, mount) -> None:
    """A sharded scale directory, a shard file, a zarr chunk directory and a plain directory that are links
    all lead out of the source: none is shown, listed, or read through."""
    vol = public_tmp / "vol"
    peers.write_tensorstore_volume(vol, extra_unsharded_scale=False)
    real = sorted((vol / "4_4_40").iterdir())
    (vol / "4_4_40").rename(public_tmp / "scale-outside")
    (vol / "4_4_40").symlink_to(public_tmp / "scale-outside")  # a scale directory that is a link
    (public_tmp / "scale-outside" / "notes.txt").write_text("outside the source")
    (vol / "etc").symlink_to(secret)
    m = mount(vol, "-o", "allow_other", under=public_tmp)
    assert sorted(os.listdir(m.path)) == ["4_4_40", "info"]  # the scale its info names, and no `etc`
    assert os.listdir(m.path / "4_4_40") == []  # neither chunks from the shards out there nor their neighbours
    for name in ("etc/f", f"4_4_40/{real[0].name}", "4_4_40/0-16_0-16_0-8", "4_4_40/notes.txt"):
        with pytest.raises(FileNotFoundError):
            (m.path / name).read_bytes()

    kv = public_tmp / "kv"  # a shard that is a link to a real shard elsewhere
    values = peers.write_tensorstore_kv(kv, {k: bytes([k]) * 9 for k in range(40)}, sharding=SINGLE_SHARD)
    (kv / "0.shard").rename(public_tmp / "0.shard")
    (kv / "0.shard").symlink_to(public_tmp / "0.shard")
    m = mount(kv, "-o", "allow_other")
    assert os.listdir(m.path) == ["info"]
    with pytest.raises(FileNotFoundError):
        (m.path / "1").read_bytes()
    assert values[1] == b"\x01" * 9

    arr = public_tmp / "arr.zarr"  # a zarr chunk directory that is a link
    zarr.create_array(arr, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")[...] = 7
    (arr / "c" / "1").rename(public_tmp / "c1")
    (arr / "c" / "1").symlink_to(public_tmp / "c1")
    m = mount(arr, "-o", "allow_other")
    assert sorted(os.listdir(m.path / "c")) == ["0", "1"]  # inner rows 0 and 1 come from shard row c/0
    with pytest.raises(FileNotFoundError):
        (m.path / "c" / "2" / "0").read_bytes()
    assert (m.path / "c" / "0" / "0").read_bytes() == (m.path / "c" / "1" / "1").read_bytes()


SINGLE_SHARD = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=1, shard_bits=0)


def test_swapping_a_directory_for_a_link_never_reads_outside(public_tmp, secret, mount) -> None:
    """The race of issue 11: a user who owns a directory in the source swaps it with a link to a secret
    directory (renameat2 exchange) while files below it are opened through the mount. Each name is fresh,
    so every open resolves its path anew in the daemon. Not one read may see the secret."""
    src = public_tmp / "src"
    peers.write_tensorstore_kv(src, {1: b"one"}, sharding=SINGLE_SHARD)
    attacker = src / "mine"
    attacker.mkdir()
    m = mount(src, "-o", "allow_other", "-o", "entry_timeout=0,attr_timeout=0,negative_timeout=0")
    seen: dict[bytes, int] = {}
    swaps = 0
    deadline = time.monotonic() + 6
    batch = 0
    while time.monotonic() < deadline:
        pairs = []
        for n in range(1000):
            d, link = attacker / f"d{batch}_{n}", attacker / f"l{batch}_{n}"
            d.mkdir()
            (d / "f").write_bytes(b"harmless")
            link.symlink_to(secret)
            pairs.append((d, link))
        stop = threading.Event()

        def swap(pairs=pairs, stop=stop) -> None:
            nonlocal swaps
            while not stop.is_set():
                for d, link in pairs:
                    exchange(d, link)
                    swaps += 1

        swapper = threading.Thread(target=swap)
        swapper.start()
        try:
            for d, _ in pairs:
                try:
                    data = (m.path / "mine" / d.name / "f").read_bytes()
                except OSError as e:
                    data = errno.errorcode[e.errno].encode()
                seen[data] = seen.get(data, 0) + 1
        finally:
            stop.set()
            swapper.join()
        batch += 1
    assert b"SECRET" not in seen, seen
    assert seen.get(b"harmless", 0) > 0 and swaps > 10_000, (seen, swaps)  # the race really ran


def test_private_parts_of_a_source_stay_private(public_tmp, mount, user) -> None:
    """A 0700 scale directory and 0600 shards: another user can neither list nor read their chunks; a shard
    opened to all serves its chunks to all; passthrough files keep their own modes. Root still reads all."""
    vol = public_tmp / "vol"
    peers.write_tensorstore_volume(vol, extra_unsharded_scale=True)
    (vol / "private.txt").write_text("private")
    (vol / "private.txt").chmod(0o600)
    scale = vol / "4_4_40"
    shards = sorted(scale.iterdir())
    assert len(shards) > 1
    for shard in shards:
        shard.chmod(0o600)
    shards[0].chmod(0o644)  # one shard open to all
    scale.chmod(0o700)
    m = mount(vol, "-o", "allow_other", under=public_tmp)

    assert denied(as_user(user, "ls", m.path / "4_4_40"))
    chunks = sorted(os.listdir(m.path / "4_4_40"))  # root lists them
    assert chunks and all(denied(as_user(user, "cat", m.path / "4_4_40" / c)) for c in chunks[:5])
    assert denied(as_user(user, "cat", m.path / "private.txt"))
    assert as_user(user, "cat", m.path / "info").returncode == 0
    unsharded = next((m.path / "8_8_40").iterdir())
    assert as_user(user, "cat", unsharded).returncode == 0

    scale.chmod(0o755)  # the directory opened: now each chunk is as open as its own shard
    m = mount(vol, "-o", "allow_other", under=public_tmp)
    listed = as_user(user, "ls", m.path / "4_4_40")
    assert listed.returncode == 0 and sorted(listed.stdout.split()) == chunks
    open_shard = shards[0].name
    readable = [c for c in chunks if as_user(user, "cat", m.path / "4_4_40" / c).returncode == 0]
    private = set(chunks) - set(readable)
    assert readable and private, "both kinds of shard hold chunks"
    src = peers.volume_chunk_shards(vol, "4_4_40")  # which shard holds which chunk, by the spec's maths
    assert {c for c in chunks if src[c] == open_shard} == set(readable)
    assert all(denied(as_user(user, "cat", m.path / "4_4_40" / c)) for c in sorted(private)[:5])


def test_zarr_directories_are_searchable_as_their_shards_directories(public_tmp, mount, user) -> None:
    """An array directory closed to others hides the array; a closed shard row directory (c/1) closes the
    inner rows it holds (c/4 to c/7), not the others."""
    root = public_tmp / "h.zarr"
    group = zarr.open_group(root, mode="w")
    data = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    for name in ("open", "closed"):
        group.create_array(name, shape=(64, 64), chunks=(4, 4), shards=(16, 16), dtype="u2")[...] = data
    (root / "closed").chmod(0o700)
    (root / "open" / "c" / "1").chmod(0o700)
    m = mount(root, "-o", "allow_other", under=public_tmp)
    assert denied(as_user(user, "ls", m.path / "closed"))
    assert as_user(user, "ls", m.path / "open" / "c" / "0").returncode == 0
    assert as_user(user, "cat", m.path / "open" / "c" / "3" / "15").returncode == 0
    assert denied(as_user(user, "ls", m.path / "open" / "c" / "4"))
    assert denied(as_user(user, "cat", m.path / "open" / "c" / "7" / "0"))
    assert (m.path / "open" / "c" / "7" / "0").read_bytes()  # root reads it


def test_a_source_under_a_closed_directory_is_closed(tmp_path, public_tmp, mount, user) -> None:
    """The directories above the source count too: pytest's temp root is 0700, so nothing is open to others."""
    kv = tmp_path / "kv"
    peers.write_tensorstore_kv(kv, {1: b"one"}, sharding=SINGLE_SHARD)
    m = mount(kv, "-o", "allow_other", under=public_tmp)
    assert (m.path / "1").read_bytes() == b"one"
    assert as_user(user, "stat", m.path).returncode == 0  # the mount is reached; what it shows is closed
    assert denied(as_user(user, "cat", m.path / "1"))
    assert denied(as_user(user, "ls", m.path))


DAEMON_FILES = 256  # the daemon's descriptor limit in the test: far fewer than the handles held


def test_directory_handles_held_by_another_user_cost_the_daemon_no_descriptor(
    public_tmp, mount, user, other_user
) -> None:
    """Another user opens a 400-file directory 1,100 times, reads one batch of entries from each handle and
    holds them all, against a root `allow_other` mount whose daemon may open 256 descriptors (lowered for that
    pid alone): the daemon holds no descriptor for a handle, so root still lists every directory and reads
    every chunk and file, and so does the user."""
    vol, twin = public_tmp / "vol", public_tmp / "twin"
    peers.write_tensorstore_volume(vol, unsharded_twin=twin, extra_unsharded_scale=False)
    notes = vol / "notes"
    notes.mkdir()
    for i in range(400):
        (notes / f"note-{i:03d}.txt").write_text(f"note {i}\n")
    m = mount(vol, "-o", "allow_other", under=public_tmp)
    resource.prlimit(daemon_of(m.path).pid, resource.RLIMIT_NOFILE, (DAEMON_FILES, DAEMON_FILES))
    holder = hold_directory(other_user, m.path / "notes", 1100)
    try:
        assert holder.stdout.readline().split() == ["held", "1100", "failed", "0"]
        chunks = sorted(os.listdir(twin / "4_4_40"))
        assert sorted(os.listdir(m.path / "4_4_40")) == chunks
        for name in chunks:
            assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
        assert sorted(os.listdir(m.path / "notes")) == sorted(os.listdir(notes))
        assert (m.path / "notes" / "note-399.txt").read_text() == "note 399\n"
        assert as_user(user, "ls", m.path / "notes").stdout.split() == sorted(os.listdir(notes))
    finally:
        holder.communicate(timeout=60)


def test_a_directory_of_datasets_opens_each_no_wider_than_its_source(public_tmp, mount, user) -> None:
    """A mount of a directory holding datasets (not itself one): a dataset under a 0700 directory is closed to
    another user through every name below it, an open one reads; a link to a dataset outside is not shown,
    to root either, and nothing through it resolves."""
    lab = public_tmp / "lab"
    peers.write_tensorstore_volume(lab / "open" / "vol")
    peers.write_tensorstore_volume(lab / "closed" / "vol")
    (lab / "closed").chmod(0o700)
    outside = public_tmp / "outside"
    peers.write_tensorstore_volume(outside / "vol")
    (lab / "linked").symlink_to(outside / "vol")
    m = mount(lab, "-o", "allow_other", under=public_tmp)

    chunk = sorted(os.listdir(m.path / "open" / "vol" / "4_4_40"))[0]
    read = as_user(user, "cat", m.path / "open" / "vol" / "4_4_40" / chunk)
    assert read.returncode == 0, read.stderr
    closed = m.path / "closed" / "vol"
    assert sorted(os.listdir(closed / "4_4_40")) == sorted(os.listdir(m.path / "open" / "vol" / "4_4_40"))
    assert denied(as_user(user, "ls", m.path / "closed"))
    assert denied(as_user(user, "cat", closed / "info"))
    assert denied(as_user(user, "cat", closed / "4_4_40" / chunk))
    assert sorted(os.listdir(m.path)) == ["closed", "open"]
    for name in ("linked", "linked/info", f"linked/4_4_40/{chunk}"):
        assert not (m.path / name).exists()
