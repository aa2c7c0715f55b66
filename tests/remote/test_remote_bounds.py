"""Listings over HTTP, where no hole can be seen and a shard can fail alone: a shard claiming a 256 GiB
shard index lists within a budget of requests and leaves the mount unmountable at once, and a shard the
server fails on is left out while the others list. Through the kernel, against RangeServer on loopback;
`ls` runs as a subprocess with a timeout, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import struct
import subprocess
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest
import zarr

import shardfs
from shardfs.fuse.listing import WORKERS
from shardfs.service.daemon import REMOTE_THREADS
from shardfs.shards.listing import LISTING_BLOCK, LISTING_BUDGET
from shardfs.stores import remote
from shardfs.stores.location import parse_source
from shardfs.stores.remote import READS_AT_ONCE, Access, RemoteStore
from tests.support import peers
from tests.support.daemons import daemon_of, wait_for, wait_until
from tests.support.http_server import RangeServer
from tests.support.users import hold_directory

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]


PROMPT = 60  # seconds within which a bounded listing returns: a ceiling only an unbounded one (256 GiB) reaches


def listing(path: Path, mountpoint: Path) -> list[str]:
    """`ls path`, within PROMPT seconds. A listing stuck in the kernel cannot be killed (its READDIR waits on
    the daemon), so past PROMPT the daemon is killed, which ends the wait, and the test fails."""
    ls = subprocess.Popen(["ls", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = ls.communicate(timeout=PROMPT)
    except subprocess.TimeoutExpired:
        daemon_of(mountpoint).kill()
        ls.communicate()
        raise AssertionError(f"`ls {path}` still runs after {PROMPT} s") from None
    assert ls.returncode == 0, err
    return out.split()


def test_a_256_gib_shard_index_over_http_lists_within_the_budget(tmp_path, mount) -> None:
    """minishard_bits 34: a shard index of 16 * 2^34 bytes, on disk a hole the server streams as zeros. One
    key sits in the first block, one 128 GiB in: the listing reads at most its budget and shows the first;
    both read right by name; the mount unmounts at once."""
    root = tmp_path / "kv"
    root.mkdir()
    spec = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=34, shard_bits=0,
                               minishard_index_encoding="raw", data_encoding="raw")  # fmt: skip
    (root / "info").write_text(json.dumps({"sharding": spec}))
    index_size, near, far = 16 << 34, 5, 1 << 33  # identity hash: a key's minishard is the key
    values = {near: b"near", far: b"far away"}
    with (root / "0.shard").open("wb") as f:
        at = 0  # relative to the end of the shard index, where each value is followed by its minishard index
        for key, value in values.items():
            rows = struct.pack("<3Q", key, at, len(value))  # key, offset after the previous chunk (none), size
            f.seek(16 * key)
            f.write(struct.pack("<QQ", at + len(value), at + len(value) + len(rows)))
            f.seek(index_size + at)
            f.write(value + rows)
            at += len(value) + len(rows)
    with RangeServer(root).running() as server:
        m = mount(server.url)
        assert listing(m.path, m.path) == [str(near), "info"]
        # the read that opens the shard (one index entry: its answer names the version), the blocks the budget
        # allows, the one minishard index
        assert server.gets("0.shard") <= 1 + LISTING_BUDGET // LISTING_BLOCK + 1
        log = m.log_text()
        assert "event=listing_budget" in log and "0.shard" in log, log
        assert str(index_size) in log and str(LISTING_BUDGET) in log
        assert listing(m.path, m.path) == [str(near), "info"]  # a second listing: the same, and said once
        assert m.log_text().count("event=listing_budget") == 1
        before = server.gets("0.shard")
        assert (m.path / str(far)).read_bytes() == values[far]  # found by name: its index entry, index, data
        assert server.gets("0.shard") - before == 3
        assert (m.path / str(near)).read_bytes() == values[near]
        subprocess.run(["fusermount3", "-u", m.path], check=True, timeout=PROMPT)
        assert not os.path.ismount(m.path)


def test_a_shard_the_server_fails_on_is_left_out_of_listings(tmp_path, mount) -> None:
    """One shard fails the read that opens it, another (already opened, one minishard index read) its other
    reads: each is logged once, by name and reason, and left out, but for what the index already read holds;
    the other shards' chunks list and read as the unsharded twin's."""
    source, twin = tmp_path / "src", tmp_path / "twin"
    peers.write_tensorstore_volume(source, data_encoding="raw", unsharded_twin=twin)
    shards = peers.volume_chunk_shards(source, "4_4_40")
    no_head, no_get = sorted(set(shards.values()))[:2]
    with RangeServer(source).running() as server:
        m = mount(server.url, "--timeout", "2")
        stated = next(n for n, s in shards.items() if s == no_get)
        (m.path / "4_4_40" / stated).stat()  # its shard index and one minishard index are remembered
        for shard in (no_head, no_get):
            server.fail[f"4_4_40/{shard}"] = [503] * 10_000  # every request for it, retries included
        listed = listing(m.path / "4_4_40", m.path)
        names = [n for n in listed if shards[n] != no_get]
        assert names == sorted(n for n, s in shards.items() if s not in (no_head, no_get))
        assert len(names) > 10
        partly = [n for n in listed if shards[n] == no_get]
        assert stated in partly and len(partly) < sum(s == no_get for s in shards.values()), partly
        for name in names:
            assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
        skips = [line for line in m.log_text().splitlines() if "listing skips a shard" in line]
        assert len(skips) == 2 and all("level=warning" in line and "failed" in line for line in skips), skips
        assert {shard for shard in (no_head, no_get) for line in skips if shard in line} == {no_head, no_get}


BUCKET = "bkt"
# --timeout: a listing's walk may take LISTING_TIMEOUTS of it, and each request half of it, which a loaded machine
# must not reach (at 1 s, a page's request failed at 0.5 s in a loaded CI run: the walk ended on that error instead)
TIMEOUT = 4


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A volume scale `s0` of 2,048 one-voxel chunks in four shards, and their names."""
    root = tmp_path_factory.mktemp("grid") / "src"
    return root, peers.write_tensorstore_chunk_grid(root, (16, 16, 8))


def test_directory_handles_held_over_http_cost_no_threads(grid, public_tmp, mount, other_user) -> None:
    """Another user holds 20 handles of a 2,048-chunk directory over HTTP, each after one 4 KiB getdents,
    against a root `allow_other` mount: the listing is made once by the mount's shared threads, and no handle
    keeps any (a listing's own pool of 64 per handle took a daemon from 69 to 342 threads)."""
    source, names = grid
    with RangeServer(source).running() as server:
        m = mount(server.url, "-o", "allow_other", under=public_tmp)
        daemon = daemon_of(m.path)
        # The mount answers from its first session thread while the others are still starting: count from
        # when all of them run, or they would be counted as the handles' cost.
        wait_until(lambda: daemon.num_threads() >= REMOTE_THREADS)
        idle = daemon.num_threads()
        holder = hold_directory(other_user, m.path / "s0", 20)
        try:
            assert holder.stdout.readline().split() == ["held", "20", "failed", "0"]
            grown = daemon.num_threads() - idle
            assert grown <= READS_AT_ONCE + WORKERS, f"{idle} threads idle, {grown} more with 20 handles held"
            assert sorted(listing(m.path / "s0", m.path)) == sorted(names)
        finally:
            holder.communicate(timeout=60)
        assert daemon.num_threads() - idle <= READS_AT_ONCE + WORKERS


def memory_mib(pid: int) -> int:
    """The peak resident memory of a process (VmHWM), in MiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]) >> 10


def settled(server: RangeServer) -> bool:
    """Whether the server is asked for no more listings, a second after the last."""
    before = server.lists
    time.sleep(1)
    return server.lists == before


@pytest.fixture
def kv_bucket(tmp_path: Path) -> tuple[Path, dict[int, bytes]]:
    """(root served, values): a sharded key-value directory at BUCKET/kv."""
    root = tmp_path / "served"
    return root, peers.write_tensorstore_kv(root / BUCKET / "kv", {k: b"v%d" % k for k in range(50)})


def test_a_listing_that_pages_forever_ends_with_what_it_found(kv_bucket, mount) -> None:
    """An S3-style endpoint that answers every listing with a thousand new names and "more to come": `ls`
    returns within its bound (LISTING_TIMEOUTS times --timeout for each walk) with the names found, said once
    a walk; then no more listings are asked for, and the daemon stays small."""
    root, values = kv_bucket
    with RangeServer(root).running() as server:
        m = mount(f"s3://{BUCKET}/kv", "--endpoint", server.url, "--anonymous", "--timeout", str(TIMEOUT))
        pid = daemon_of(m.path).pid
        server.endless_listing = "objects"
        listed = listing(m.path, m.path)
        assert len(listed) > 1000 and "info" in listed, listed[:5]
        assert wait_for(lambda: settled(server))
        assert "event=listing_bound" in m.log_text()
        assert memory_mib(pid) < 400
        assert (m.path / "7").read_bytes() == values[7]


@pytest.mark.parametrize(("page_seconds", "pages"), [(0.999, 41), (1.0, 40), (1.001, 40)])
def test_a_walk_lasts_four_timeouts_to_the_page(kv_bucket, monkeypatch, page_seconds, pages) -> None:
    """A walk over pages of new names forever, each taking page_seconds on the walk's clock, with --timeout 10:
    it asks until 40 s have gone (four timeouts), the page that ends a hair before them followed by one more."""
    root, _ = kv_bucket
    with RangeServer(root).running() as server:
        server.endless_listing = "objects"
        store = RemoteStore(parse_source(f"s3://{BUCKET}/kv"), Access(anonymous=True, endpoint=server.url, timeout=10))
        before = server.lists
        clock = SimpleNamespace(monotonic=lambda: (server.lists - before) * page_seconds)
        monkeypatch.setattr(remote, "time", clock)
        assert len(list(store.list(""))) == 1000 * pages
        assert server.lists - before == pages


@pytest.mark.parametrize(("past", "pages"), [(-1, 3), (0, 3), (1, 4)], ids=["one below", "at", "one above"])
def test_a_walk_gathers_names_up_to_its_bytes_not_its_objects(kv_bucket, monkeypatch, past, pages) -> None:
    """Pages of a thousand new names forever, against LISTING_BYTES set to three pages' bytes of names and one
    byte either side: the walk stops at the page that reaches its bytes."""
    root, _ = kv_bucket
    with RangeServer(root).running() as server:
        server.endless_listing = "objects"
        store = RemoteStore(parse_source(f"s3://{BUCKET}/kv"), Access(anonymous=True, endpoint=server.url))
        monkeypatch.setattr(remote, "LISTING_REQUESTS", 1)
        first = [name for name, _ in store.list("")]  # one page: its names' length
        assert len(first) == 1000 and len({len(name) for name in first}) == 1
        monkeypatch.setattr(remote, "LISTING_REQUESTS", 10_000)
        monkeypatch.setattr(remote, "LISTING_BYTES", 3 * 1000 * len(first[0]) + past)
        assert len(list(store.list(""))) == 1000 * pages


def test_a_mount_over_a_listing_that_pages_forever_finishes(tmp_path, mount) -> None:
    """The same endpoint at mount time, under a zarr group whose children are found by listing: the mount
    finishes with what the walk found, and serves the group."""
    root = tmp_path / "served"
    zarr.open_group(root / BUCKET / "grp", mode="w")
    with RangeServer(root).running() as server:
        server.endless_listing = "objects"
        m = mount(f"s3://{BUCKET}/grp", "--endpoint", server.url, "--anonymous", "--timeout", str(TIMEOUT))
        assert json.loads((m.path / "zarr.json").read_text())["node_type"] == "group"
        assert "event=listing_bound" in m.log_text()
        assert wait_for(lambda: settled(server))


def test_df_over_a_listing_of_endless_empty_pages_stops(kv_bucket, mount) -> None:
    """`df` counts the source's objects in the background: over pages that come empty forever it stops at its
    walk's deadline, says so once, and asks for no more listings."""
    root, _ = kv_bucket
    with RangeServer(root).running() as server:
        m = mount(f"s3://{BUCKET}/kv", "--endpoint", server.url, "--anonymous", "--timeout", str(TIMEOUT))
        server.endless_listing = "empty"
        os.statvfs(m.path)  # starts the count
        assert wait_for(lambda: "event=listing_bound" in m.log_text())
        assert wait_for(lambda: settled(server))
        assert server.lists > 1


def test_a_directory_lists_its_files_and_each_subdirectory_once(tmp_path) -> None:
    """S3 directories are listed without a delimiter, a subdirectory skipped past (start-after) once a page of
    its keys has been read: every file and subdirectory comes once, `1/` beside a file `10` and a directory
    `10/`, and the 1,500 keys under `1/` cost one skip, not a page each."""
    directory = tmp_path / BUCKET / "d"
    (directory / "1").mkdir(parents=True)
    for i in range(1500):
        (directory / "1" / f"k{i:04d}").write_bytes(b"")
    (directory / "10").write_bytes(b"ten")
    (directory / "10x").mkdir()
    (directory / "10x" / "x").write_bytes(b"")
    (directory / "2" / "deep" / "er").mkdir(parents=True)
    (directory / "2" / "deep" / "er" / "y").write_bytes(b"")
    (directory / "a.txt").write_bytes(b"a")
    with RangeServer(tmp_path).running() as server:
        store = RemoteStore(parse_source(f"s3://{BUCKET}"), Access(anonymous=True, endpoint=server.url))
        listed = list(store.list("d"))
        assert sorted(listed) == [("1", True), ("10", False), ("10x", True), ("2", True), ("a.txt", False)]
        assert server.lists == 2
        assert sorted(store.list("d/2")) == [("deep", True)]
        assert list(store.list("d/nothing")) == []


def test_remembered_objects_cost_at_most_their_bound_and_absence_costs_nothing_more(tmp_path, monkeypatch) -> None:
    """Sizes and versions are remembered within REMEMBERED_BYTES, counted as measured: opening 600 objects and
    600 absent names against a 32 KiB bound allocates about that much (it was a count of 65,536 objects, some
    25 MiB outside the cache's budget), and the first, forgotten, is asked for again. A missing object asked for
    again and again costs nothing more: the one error remembered was raised again each time, keeping every
    traceback and its frames (with both, 3,000 lookups held 12 MB)."""
    monkeypatch.setattr("shardfs.stores.remote.REMEMBERED_BYTES", 32 << 10)
    for i in range(600):
        (tmp_path / f"object-{i:04d}").write_bytes(b"x")
    with RangeServer(tmp_path).running() as server:
        store = RemoteStore(parse_source(server.url), Access())
        for warm in ("object-warm", "object-0000"):  # the client and the first of each kind made
            with contextlib.suppress(FileNotFoundError):
                store.open(warm)
        tracemalloc.start(8)  # frames enough to see shardfs below cachetools, prometheus_client, threading
        try:
            before = snapshot()
            for i in range(600):
                assert store.open(f"object-{i:04d}").size == 1
                with pytest.raises(FileNotFoundError):
                    store.open(f"absent-{i:04d}")
            opened = snapshot()
            for _ in range(500):
                with pytest.raises(FileNotFoundError):
                    store.open("absent-0599")  # the last remembered: no request
            again = snapshot()
        finally:
            tracemalloc.stop()
        remembered, more = grown(before, opened), grown(opened, again)
        assert server.requests[("HEAD", "absent-0599")] == 1
        assert 0.5 * (32 << 10) <= remembered <= 1.1 * (32 << 10), f"{remembered} bytes remembered"
        assert more <= 4096, f"{more} bytes more after 500 lookups of one missing object"
        heads = server.requests[("HEAD", "object-0000")]
        store.open("object-0000")
        assert server.requests[("HEAD", "object-0000")] == heads + 1  # forgotten, asked for again


PACKAGE = Path(shardfs.__file__).parent  # the package's own files: not the tests' beside it, whatever the clone's name


def snapshot() -> tracemalloc.Snapshot:
    """What is allocated now, garbage collected first (an error's traceback and its frames form cycles)."""
    gc.collect()
    return tracemalloc.take_snapshot()


def grown(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> int:
    """Bytes allocated between two snapshots and still held, by shardfs's code (not the test's server, which
    runs in this process and keeps every request's headers)."""
    ours = [tracemalloc.Filter(True, f"{PACKAGE}{os.sep}*", all_frames=True)]
    return sum(stat.size_diff for stat in after.filter_traces(ours).compare_to(before.filter_traces(ours), "filename"))
