"""shardfs's own FUSE session (shardfs/fuse), through the kernel: a tree opened from a tensorstore-written
dataset, mounted with mount(2) and served by the session in this process, read back by plain `open()`,
`os.walk`, tensorstore and cloud-volume and compared with the unsharded twin; lookups that overlap in
one directory, FORGET storms, INTERRUPT, unmounting with requests in flight, errno for every change."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import itertools
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
from cloudvolume import CloudVolume

from shardfs.fs.bridge import Bridge
from shardfs.fuse import wire
from shardfs.fuse.mount import FuseMountError, MountOptions, mount, target_of, unmount
from shardfs.fuse.session import Serving, Session
from shardfs.fuse.wire import InitFlag, InitFlag2
from shardfs.source import open_source
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.daemons import daemon_of, machine_lock, wait_for, wait_until
from tests.support.http_server import RangeServer
from tests.support.kernel import EVERYTHING, ask, init, kernel_socket
from tests.support.reading import DROP_CACHES

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]


LATENCY = 0.5  # seconds a slow server holds each request: long enough that load cannot keep them from overlapping


@pytest.fixture
def volume(raw_volume: tuple[Path, Path, np.ndarray]) -> tuple[Path, Path, np.ndarray]:
    """Raw chunks: one read is one GET."""
    return raw_volume


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A volume of 2,048 small chunks in one sharded directory, and its unsharded twin."""
    root = tmp_path_factory.mktemp("many")
    source, twin = root / "src", root / "twin"
    peers.write_tensorstore_volume(
        source, size=(128, 128, 64), chunk=(8, 8, 8), extra_unsharded_scale=False, unsharded_twin=twin
    )
    return source, twin


@pytest.fixture
def server(volume) -> Iterator[RangeServer]:
    with RangeServer(volume[0]).running() as s:
        yield s


def fuse_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fuse-")]


@contextlib.contextmanager
def served(source: str | Path, mountpoint: Path, threads: int = 16, read_only: bool = True) -> Iterator[Session]:
    """source mounted at mountpoint by a Session running in this process; unmounted after, and the
    session found ended with all its threads."""
    tree = open_source(source, 64 << 20).tree
    mountpoint.mkdir(exist_ok=True)
    fd = mount(mountpoint, MountOptions(fsname=str(source), read_only=read_only, allow_other=True))
    ready = threading.Event()
    session = Session(fd, Bridge(tree, 0), Serving(threads), on_ready=ready.set)
    runner = threading.Thread(target=session.run, name="session")
    runner.start()
    try:
        assert ready.wait(60), "INIT never came"
        yield session
    finally:
        with contextlib.suppress(OSError):
            unmount(mountpoint, lazy=True)
        runner.join(60)
        os.close(fd)
    assert not runner.is_alive() and not fuse_threads(), "the session outlived its mount"


def relative_files(root: Path) -> set[Path]:
    return {Path(d, f).relative_to(root) for d, _, files in os.walk(root) for f in files}


def test_init_grants_parallel_lookups_and_large_reads(volume, tmp_path) -> None:
    with served(volume[0], tmp_path / "m") as session:
        assert InitFlag.PARALLEL_DIROPS | InitFlag.ASYNC_READ | InitFlag.MAX_PAGES in session.granted
        assert session.no_open  # 6.18 takes ENOSYS for OPEN: no OPEN, pages kept across opens
        assert session.minor >= 38
        mounts = Path("/proc/mounts").read_text().splitlines()
        assert f"{volume[0]} {tmp_path / 'm'} fuse.shardfs ro," in "\n".join(mounts)


def test_reads_and_listings_match_the_unsharded_twin(volume, tmp_path) -> None:
    source, twin, expected = volume
    m = tmp_path / "m"
    with served(source, m):
        files = relative_files(twin)
        assert relative_files(m) == files
        for rel in files - {Path("info")}:
            with open(m / rel, "rb") as f:  # Python's open(): it asks isatty (an IOCTL) every time
                assert not f.isatty()
                assert f.read() == (twin / rel).read_bytes(), rel
        spec = {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(m)}}
        assert np.array_equal(ts.open(dict(spec, scale_index=0)).result().read().result(), expected)
        cv = CloudVolume(f"file://{m}", mip=0, fill_missing=True, progress=False)
        assert np.array_equal(cv[:, :, :], expected)


def test_sixteen_lookups_in_one_directory_overlap(volume, server, tmp_path) -> None:
    """Each lookup of an unsharded chunk is a HEAD; 16 threads stat'ing distinct names in one directory
    have their HEADs at the server at once (libfuse 3.14's loop, without PARALLEL_DIROPS, had one)."""
    _, twin, _ = volume
    names = sorted(p.name for p in (twin / "8_8_40").iterdir())[:16]
    with served(server.url, tmp_path / "m", threads=32) as session:
        (tmp_path / "m" / "8_8_40").stat()
        server.latency = LATENCY
        server.most_in_flight = 0
        with ThreadPoolExecutor(16) as pool:
            sizes = list(pool.map(lambda n: (tmp_path / "m" / "8_8_40" / n).stat().st_size, names))
        assert sizes == [(twin / "8_8_40" / n).stat().st_size for n in names]
        assert server.most_in_flight >= 8, server.most_in_flight
        assert len(session.filesystem.nodes) >= len(names)


def drop_kernel_names() -> None:
    """Make the kernel let go of every unused dentry and inode: it FORGETs their node ids. The machine's, so
    not while a test counts on its own being kept (see machine_lock)."""
    with machine_lock(DROP_CACHES):
        DROP_CACHES.write_text("2")


@pytest.fixture(scope="module")
def segments(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    """A sharded key-value directory (as skeletons are) of 2,048 segment ids, written by tensorstore: half
    small, half past 2**63, too large to share a node id with their directory's number."""
    root = tmp_path_factory.mktemp("segments")
    keys = [*range(1, 1025), *range(2**64 - 1024, 2**64)]
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=4, shard_bits=1)
    return root, peers.write_tensorstore_kv(root, {k: k.to_bytes(8, "little") for k in keys}, sharding=spec)


def test_forget_storms_leave_no_nodes_behind(segments, tmp_path) -> None:
    """Names whose key does not fit a node id are kept in a table, each lookup counted, and every FORGET
    (batched or not) counts down: after the kernel lets go of them, three times over, the table holds only
    the root, and the names still read. Names whose key fits are kept nowhere, at any time."""
    source, items = segments
    m = tmp_path / "m"
    large = [k for k in items if k >> 63]
    with served(source, m) as session:
        for _ in range(3):
            for key in items:
                (m / str(key)).stat()
                (m / str(key)).stat()  # the kernel's entry: no second LOOKUP, nothing to forget twice
            assert len(session.filesystem.nodes) == 1 + len(large)
            drop_kernel_names()
            assert wait_for(lambda: len(session.filesystem.nodes) == 1), len(session.filesystem.nodes)
        for key in (1, large[7]):
            assert (m / str(key)).read_bytes() == items[key]


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ten_thousand_files_held_open(many, tmp_path, many_descriptors) -> None:
    """No OPEN reaches the session (no_open), so holding files open costs it nothing: 10,240 descriptors
    on 2,048 files, each read while all are held, then closed; the session holds nothing per file."""
    source, twin = many
    m = tmp_path / "m"
    names = sorted(p.name for p in (twin / "4_4_40").iterdir())
    with served(source, m) as session:
        held = [os.open(m / "4_4_40" / names[i % len(names)], os.O_RDONLY) for i in range(10_240)]
        try:
            for i, fd in enumerate(held[: len(names)]):
                assert os.read(fd, 1 << 20) == (twin / "4_4_40" / names[i]).read_bytes()
            assert all(os.pread(fd, 1, 0) for fd in held)
        finally:
            for fd in held:
                os.close(fd)
        assert len(session.filesystem.nodes) == 2  # the root and the scale: a chunk's node id is its name


def test_a_held_chunk_is_read_from_its_node_id_with_no_name_made_or_parsed(many, tmp_path) -> None:
    """GETATTR and READ of chunks the kernel holds go from each id to its key: once every name is looked up,
    no name is made from a key (Tree.path_of) nor parsed (Tree.lookup, a provider's child), whichever chunk
    was looked up last, and every byte is the twin's."""
    source, twin = many
    m = tmp_path / "m"
    names = sorted(p.name for p in (twin / "4_4_40").iterdir())
    with served(source, m) as session:
        sizes = {name: (m / "4_4_40" / name).stat().st_size for name in names}  # LOOKUPs: every id held
        tree = session.filesystem.tree

        def no_names(*args: object) -> None:
            raise AssertionError(f"a name made or parsed for a held id: {args}")

        tree.path_of = tree.lookup = no_names  # type: ignore[method-assign]
        for provider in tree.providers.values():
            provider.child = no_names  # type: ignore[method-assign]
        for name in reversed(names):  # never the chunk looked up last
            fd = os.open(m / "4_4_40" / name, os.O_RDONLY)
            try:
                assert os.read(fd, 1 << 20) == (twin / "4_4_40" / name).read_bytes()
                assert os.fstat(fd).st_size == sizes[name]
            finally:
                os.close(fd)


def test_a_lookup_goes_from_its_parents_node_with_no_walk_up_the_path(many, tmp_path) -> None:
    """LOOKUP asks the parent's node, which knows its provider: once the directory is looked up, no path is
    walked up to find a provider again (Tree.locate), for a chunk, a name that is not there or the rewritten
    metadata, and LOOKUP is counted under its own label, not GETATTR's."""
    source, twin = many
    m = tmp_path / "m"
    names = sorted(p.name for p in (twin / "4_4_40").iterdir())
    with served(source, m) as session:
        assert (m / "4_4_40").is_dir()
        tree = session.filesystem.tree

        def walked(path: str) -> None:
            raise AssertionError(f"a path walked up for a lookup: {path}")

        tree.locate = walked  # type: ignore[method-assign]
        assert [(m / "4_4_40" / name).stat().st_size for name in names[:50]] == [
            (twin / "4_4_40" / name).stat().st_size for name in names[:50]
        ]
        assert not (m / "4_4_40" / "0-1_0-1_0-1").exists() and not (m / "4_4_40" / "nope").exists()
        assert json.loads((m / "info").read_bytes()) == json.loads((twin / "info").read_bytes())
        answered: collections.Counter[str] = collections.Counter()
        for key, value in session.filesystem.metrics.tally.totals().items():  # (histogram, op, bucket): count
            if isinstance(key, tuple) and key[0] == "shardfs_fuse_op_seconds" and key[2] != "sum":
                answered[key[1]] += int(value)
        assert answered["lookup"] >= 53 and answered["getattr"] < 53


def test_listing_of_thousands_resumes_where_each_page_ended(many, tmp_path) -> None:
    """2,048 names take about twenty READDIR requests of a page each; every one resumes at its offset."""
    source, twin = many
    with served(source, tmp_path / "m"):
        listed = os.listdir(tmp_path / "m" / "4_4_40")
        assert sorted(listed) == sorted(os.listdir(twin / "4_4_40"))
        assert len(listed) == len(set(listed))


GRID = (64, 64, 32)  # 131,072 chunk files in one directory


@pytest.fixture(scope="module")
def chunk_grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A volume scale `s0` of 131,072 one-voxel chunks, and their names."""
    root = tmp_path_factory.mktemp("grid") / "src"
    return root, peers.write_tensorstore_chunk_grid(root, GRID)


def test_a_listing_of_131072_names_resumes_where_each_page_ended(chunk_grid, tmp_path) -> None:
    """131,072 names take thousands of READDIR pages; each resumes at its offset, so the tree lists the
    directory once, and every name comes once."""
    source, names = chunk_grid
    with served(source, tmp_path / "m") as session:
        made = itertools.count()
        listdir = session.filesystem.tree.listdir

        def counted(path: str) -> Iterator[tuple[str, bool]]:
            for entry in listdir(path):
                next(made)
                yield entry

        session.filesystem.tree.listdir = counted  # type: ignore[method-assign]
        listed = os.listdir(tmp_path / "m" / "s0")
        assert sorted(listed) == sorted(names)
        assert next(made) == len(names)


class Dirent(ctypes.Structure):
    """glibc's struct dirent on 64-bit Linux."""

    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64), ("d_reclen", ctypes.c_ushort),
                ("d_type", ctypes.c_ubyte), ("d_name", ctypes.c_char * 256)]  # fmt: skip


def libc_directory() -> ctypes.CDLL:
    """glibc's opendir, readdir, telldir, seekdir and closedir: what `telldir`/`seekdir` users call."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.readdir.argtypes = libc.telldir.argtypes = libc.closedir.argtypes = [ctypes.c_void_p]
    libc.readdir.restype = ctypes.POINTER(Dirent)
    libc.telldir.restype = ctypes.c_long
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    return libc


def test_seeking_a_directory_of_131072_names_resumes_in_place(chunk_grid, tmp_path) -> None:
    """telldir before each entry, then seekdir to 200 of those positions, far ones and near, in any order:
    each resumes at its entry, and the directory is listed once (a seek used to list it again from the start,
    half a second for each far one)."""
    source, names = chunk_grid
    libc = libc_directory()
    with served(source, tmp_path / "m") as session:
        listdir, made = session.filesystem.tree.listdir, []
        session.filesystem.tree.listdir = lambda path: made.append(path) or listdir(path)  # type: ignore[method-assign]
        directory = libc.opendir(bytes(tmp_path / "m" / "s0"))
        assert directory, os.strerror(ctypes.get_errno())
        try:
            positions, listed = [], []
            while True:
                position = libc.telldir(directory)
                entry = libc.readdir(directory)
                if not entry:
                    break
                positions.append(position)
                listed.append(entry.contents.d_name.decode())
            assert sorted(listed) == sorted([".", "..", *names])
            rng = random.Random(27)
            for i in [len(listed) - 1, 0, *rng.sample(range(len(listed)), 198)]:
                libc.seekdir(directory, positions[i])
                got = [libc.readdir(directory) for _ in range(3)]
                assert [e.contents.d_name.decode() for e in got if e] == listed[i : i + 3], i
        finally:
            libc.closedir(directory)
        assert made == ["s0"]


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of a process: its peak and present resident memory."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]), int(status["VmRSS"].split()[0])


def test_ls_l_of_131072_chunks_grows_the_daemon_by_directories_not_files(chunk_grid, mount) -> None:
    """`ls -l` of 131,072 chunks: the kernel keeps an entry of each (for a day), but a chunk's node id is
    its name, so the daemon keeps nothing per file: it stays within --cache-size + 100 MiB, and grows by
    less than the budget, the directory's listing (its entries as the kernel reads them, 56 bytes a name
    here: 7 MiB, the one value the cache keeps over its budget) and 20 MiB (a table of the paths the kernel
    holds grew it by 36 MiB here; keeping nothing, by about 12). Every chunk has its own inode number, and
    its own voxel."""
    source, names = chunk_grid
    budget_mib = 1
    m = mount(source, "--cache-size", f"{budget_mib}M")
    pid = daemon_of(m.path).pid
    _, idle = memory_kib(pid)
    inos = {entry.name: entry.stat().st_ino for entry in os.scandir(m.path / "s0")}
    peak, now = memory_kib(pid)
    assert now < (budget_mib + 100) << 10, f"{now >> 10} MiB"
    listing_mib = 56 * len(names) >> 20
    grown = peak - idle
    assert grown < (budget_mib + listing_mib + 20) << 10, f"grew by {grown >> 10} MiB from {idle >> 10} MiB"
    assert len(inos) == len(set(inos.values())) == len(names)
    for x, y, z in [(0, 0, 0), (5, 63, 17), (63, 63, 31)]:
        key = peers.compressed_morton_code((x, y, z), GRID)
        assert (m.path / "s0" / f"{x}-{x + 1}_{y}-{y + 1}_{z}-{z + 1}").read_bytes() == bytes([key & 0xFF])


@pytest.fixture(scope="module")
def zarr_array(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zarr v3 array sharded by tensorstore: 6 x 5 shards of 2 x 2 inner chunks, all written."""
    root = tmp_path_factory.mktemp("zarr") / "a.zarr"
    array = peers.create_tensorstore_zarr3(root, [24, 20], "uint16", [4, 4], [2, 2])
    array.write(np.arange(480, dtype=np.uint16).reshape(24, 20)).result()
    return root


@pytest.fixture(scope="module")
def meshes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sharded multi-resolution meshes written the igneous way (cloud-volume): `<id>` and `<id>.index`."""
    root = tmp_path_factory.mktemp("meshes")
    peers.write_cloudvolume_multires_meshes(root)
    return root


@pytest.fixture(scope="module")
def annotations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sharded annotations (tensorstore): by id, by segment and by grid cell, three numbered directories."""
    root = tmp_path_factory.mktemp("annotations")
    peers.write_tensorstore_annotations(root)
    return root


METADATA = {"info", "zarr.json", "attributes.json", ".zarray", ".zattrs", ".zgroup"}


@pytest.mark.parametrize(
    "dataset, view, chunks",
    [("raw_volume", "native", "4_4_40"), ("raw_volume", "n5", ""), ("zarr_array", "native", ""),
     ("zarr_array", "zarr2", ""), ("meshes", "native", "mesh"), ("annotations", "native", "")],
)  # fmt: skip
def test_a_chunk_has_the_same_inode_number_after_a_restart_and_in_listings(
    dataset, view, chunks, request, mount
) -> None:
    """A chunk file's node id, which `stat` shows as its inode number, is its name: a new daemon, asked for
    the chunks in another order, numbers each as the first did, and no two alike; a listing shows the same
    number (`find -inum`, `os.scandir`'s inode()) without a lookup."""
    found = request.getfixturevalue(dataset)
    source = found[0] if isinstance(found, tuple) else found
    first = mount(source, "--view", view).path
    paths = sorted(
        Path(d, f).relative_to(first) for d, _, files in os.walk(first / chunks) for f in files if f not in METADATA
    )
    before = {p: (first / p).stat().st_ino for p in paths}
    shardfs("unmount", first)
    again = mount(source, "--view", view).path
    after = {p: (again / p).stat().st_ino for p in reversed(paths)}
    assert len(paths) >= 8 and after == before and len(set(before.values())) == len(paths)
    listed = {
        Path(directory, entry.name): entry.inode()
        for directory in {p.parent for p in paths}
        for entry in os.scandir(again / directory)
        if entry.is_file() and entry.name not in METADATA
    }
    assert listed == after


def test_interrupted_lookup_is_answered_and_the_session_goes_on(volume, server, tmp_path) -> None:
    """A signal to a process waiting on a slow LOOKUP makes the kernel send INTERRUPT; the lookup is
    answered all the same, and a reader killed meanwhile leaves nothing stuck."""
    _, twin, _ = volume
    names = sorted(p.name for p in (twin / "8_8_40").iterdir())
    m = tmp_path / "m"
    code = "import os, signal, sys; signal.signal(signal.SIGUSR1, lambda *a: None); print(os.stat(sys.argv[1]).st_size)"
    with served(server.url, m) as session:
        (m / "8_8_40").stat()
        server.latency = 1.0
        patient = subprocess.Popen([sys.executable, "-c", code, m / "8_8_40" / names[0]], stdout=subprocess.PIPE)
        killed = subprocess.Popen([sys.executable, "-c", code, m / "8_8_40" / names[1]])
        assert wait_for(lambda: server.in_flight >= 2)
        patient.send_signal(signal.SIGUSR1)
        killed.kill()
        out, _ = patient.communicate(timeout=60)
        assert int(out) == (twin / "8_8_40" / names[0]).stat().st_size
        assert killed.wait(timeout=60) == -signal.SIGKILL
        assert wait_for(lambda: session.interrupts >= 1)
        server.latency = 0
        assert (m / "8_8_40" / names[2]).read_bytes() == (twin / "8_8_40" / names[2]).read_bytes()


def test_unmount_with_lookups_in_flight_ends_the_session(volume, server, tmp_path) -> None:
    _, twin, _ = volume
    names = sorted(p.name for p in (twin / "8_8_40").iterdir())[:8]
    m = tmp_path / "m"
    results: list[object] = []

    def stat(name: str) -> None:
        try:
            results.append((m / "8_8_40" / name).stat().st_size)
        except OSError as e:
            results.append(e.errno)

    with served(server.url, m):
        (m / "8_8_40").stat()
        server.latency = 1.0
        readers = [threading.Thread(target=stat, args=(name,)) for name in names]
        for reader in readers:
            reader.start()
        assert wait_for(lambda: server.in_flight >= 4)
        unmount(m, lazy=True)
        for reader in readers:
            reader.join(60)
        assert len(results) == len(names)  # each one answered; the fixture checks the session ended
    assert not os.path.ismount(m)


def test_every_change_is_refused_read_only(volume, tmp_path) -> None:
    """Mounted without `ro`, every change reaches the session: each is EROFS, as a user expects."""
    source, twin, _ = volume
    m = tmp_path / "m"
    name = sorted(p.name for p in (twin / "4_4_40").iterdir())[0]
    chunk = m / "4_4_40" / name
    with served(source, m, read_only=False):
        changes = [
            lambda: os.mkdir(m / "new"),
            lambda: os.close(os.open(m / "new", os.O_WRONLY | os.O_CREAT, 0o644)),
            lambda: os.unlink(chunk),
            lambda: os.rmdir(m / "8_8_40"),
            lambda: os.rename(chunk, m / "moved"),
            lambda: os.symlink("x", m / "link"),
            lambda: os.link(chunk, m / "hard"),
            lambda: os.truncate(chunk, 0),
            lambda: os.chmod(chunk, 0o600),
            lambda: os.utime(chunk, (0, 0)),
            lambda: os.setxattr(chunk, "user.x", b"1"),
            lambda: os.removexattr(chunk, "user.x"),
            lambda: os.mknod(m / "fifo", 0o600 | 0o010000),
        ]
        for change in changes:
            with pytest.raises(OSError) as e:
                change()
            assert e.value.errno == errno.EROFS, (change, e.value)
        with pytest.raises(OSError) as e:
            os.getxattr(chunk, "user.x")
        assert e.value.errno == errno.EOPNOTSUPP
        with pytest.raises(OSError) as e:
            os.readlink(chunk)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(FileNotFoundError):
            (m / "4_4_40" / "nothing").stat()
        assert chunk.read_bytes() == (twin / "4_4_40" / name).read_bytes()


def test_absences_are_kept_by_the_kernel(volume, server, tmp_path) -> None:
    """A LOOKUP of a missing name is answered with node id 0 and the negative timeout: asked once."""
    m = tmp_path / "m"
    with served(server.url, m):
        (m / "8_8_40").stat()
        before = sum(server.requests.values())
        for _ in range(3):
            assert not (m / "8_8_40" / "0-1_0-1_0-1").exists()
        asked = sum(server.requests.values()) - before
        assert asked > 0
        assert not (m / "8_8_40" / "0-1_0-1_0-1").exists()
        assert sum(server.requests.values()) - before == asked


@pytest.mark.parametrize("minor", [40, 44])
def test_init_answers_a_kernel_as_new_or_newer_with_our_minor(volume, minor) -> None:
    with kernel_socket(volume[0]) as (kernel, session):
        code, reply = init(kernel, 7, minor, EVERYTHING, InitFlag2.HAS_RESEND)
        assert code == 0 and len(reply) == wire.INIT_OUT.size
        major, got_minor, readahead, flags, _, _, max_write, gran, max_pages, *_ = wire.INIT_OUT.unpack(reply)
        assert (major, got_minor, readahead, max_write, gran, max_pages) == (7, 40, 1 << 17, 4096, 1, 256)
        assert session.resend  # 7.40 is the minor that carries FUSE_NOTIFY_RESEND
        assert InitFlag(flags) == InitFlag.ASYNC_READ | InitFlag.PARALLEL_DIROPS | InitFlag.MAX_PAGES
        assert session.no_open
        assert ask(kernel, wire.Op.OPEN, bytes(8), 2, 1)[0] == errno.ENOSYS  # no_open: no OPEN again


@pytest.mark.parametrize(("minor", "flags2", "resend"), [(38, 0, False), (39, 0, False), (40, 0, False)])
def test_resend_is_used_only_where_the_minor_answered_carries_it_and_the_kernel_offers_it(
    volume, minor, flags2, resend
) -> None:  # fmt: skip
    """Linux 6.1 to 6.8 speak 7.38 or 7.39 and know no FUSE_NOTIFY_RESEND: such a kernel is answered in its
    own minor, and a daemon taking up its connection never sends the notification (nor hands the mount over)."""
    with kernel_socket(volume[0]) as (kernel, session):
        code, reply = init(kernel, 7, minor, EVERYTHING, flags2)
        assert code == 0 and wire.INIT_OUT.unpack(reply)[:2] == (7, minor)
        assert session.resend is resend and session.minor == minor


def test_a_flag_offered_at_the_resend_bit_is_read_in_flags2_only(volume) -> None:
    """FUSE_HAS_RESEND is bit 39 of the flags, so bit 7 of flags2, sent only with INIT_EXT (linux/fuse.h)."""
    assert InitFlag2.HAS_RESEND == 1 << (39 - 32) and InitFlag.INIT_EXT == 1 << 30
    with kernel_socket(volume[0]) as (kernel, session):
        assert init(kernel, 7, 40, EVERYTHING & ~InitFlag.INIT_EXT, InitFlag2.HAS_RESEND)[0] == 0
        assert not session.resend  # flags2 not sent: nothing offered
    with kernel_socket(volume[0]) as (kernel, session):
        assert init(kernel, 7, 40, InitFlag.INIT_EXT | 1 << 7)[0] == 0
        assert not session.resend  # bit 7 of the low flags is another flag (FUSE_EXPORT_SUPPORT)


def test_init_answers_an_older_kernel_in_its_own_terms(volume) -> None:
    """7.22 knew neither no_open nor parallel lookups, and took a 24-byte init_out: it gets that, only
    what it offered, and OPEN answered with the kernel cache kept."""
    offered = InitFlag.ASYNC_READ | InitFlag.BIG_WRITES | InitFlag.DO_READDIRPLUS
    with kernel_socket(volume[0]) as (kernel, session):
        code, reply = init(kernel, 7, 22, offered)
        assert code == 0 and len(reply) == wire.COMPAT_22_INIT_OUT_SIZE
        major, minor, _, flags = wire.INIT_IN.unpack_from(reply)
        assert (major, minor, InitFlag(flags)) == (7, 22, InitFlag.ASYNC_READ)
        assert not session.no_open
        code, reply = ask(kernel, wire.Op.OPEN, bytes(8), 2, 1)
        assert code == 0 and wire.OPEN_OUT.unpack(reply)[1] == wire.FOPEN_KEEP_CACHE


def test_init_of_a_newer_major_asks_again_and_a_too_old_kernel_is_refused(volume) -> None:
    with kernel_socket(volume[0]) as (kernel, _):
        code, reply = init(kernel, 8, 0, EVERYTHING)
        assert code == 0 and wire.INIT_OUT.unpack(reply)[:2] == (7, 40)  # our major: the kernel asks again
        assert init(kernel, 7, 40, EVERYTHING)[0] == 0
    with kernel_socket(volume[0]) as (kernel, _):
        assert init(kernel, 7, 8, EVERYTHING)[0] == errno.EPROTO


def test_a_descriptor_mounted_by_a_parent_is_served_as_dev_fd_n(volume, tmp_path) -> None:
    """`/dev/fd/N` as the mountpoint: the parent mounted /dev/fuse itself (as a CSI driver does) and
    handed the descriptor over; the child serves it, and ends when the parent unmounts."""
    source, twin, _ = volume
    m = tmp_path / "m"
    m.mkdir()
    fd = mount(m, MountOptions(fsname=str(source)))
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fuse_serve", source, f"/dev/fd/{fd}"], pass_fds=[fd], cwd=Path.cwd()
        )
    finally:
        os.close(fd)
    try:
        name = sorted(p.name for p in (twin / "4_4_40").iterdir())[5]
        assert (m / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        unmount(m)
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            unmount(m, lazy=True)
            child.kill()


def test_dev_fd_n_must_be_an_open_fuse_device(tmp_path) -> None:
    with open(tmp_path / "f", "w") as f, pytest.raises(FuseMountError, match="not a /dev/fuse descriptor"):
        mount(target_of(Path(f"/dev/fd/{f.fileno()}")), MountOptions(fsname="x"))
    with pytest.raises(FuseMountError, match="not an open descriptor"):
        mount(target_of(Path("/dev/fd/999")), MountOptions(fsname="x"))


def test_df_shows_the_bytes_the_source_stores(volume, mount) -> None:
    """`df` on a mount: size and used are the source's stored bytes (every regular file under it, counted in
    the background from the first STATFS), nothing available (read-only); the file count is the source's."""
    source = volume[0]
    files = [p for p in source.rglob("*") if p.is_file() and not p.is_symlink()]
    stored = -(-sum(p.stat().st_size for p in files) // 512) * 512
    m = mount(source)
    wait_until(lambda: os.statvfs(m.path).f_files >= len(files))
    st = os.statvfs(m.path)
    assert (st.f_blocks * st.f_frsize, st.f_bfree, st.f_bavail, st.f_files) == (stored, 0, 0, len(files))
    df = subprocess.run(["df", "-B1", "--output=size,used,avail", m.path], capture_output=True, text=True, check=True)
    assert df.stdout.split()[-3:] == [str(stored), str(stored), "0"], df.stdout
