"""Read-ahead across files (shardfs/fs/readahead.py): a directory's files read in its listing's order, by
one process through the kernel, have the next ones fetched before they are asked for; counted at a loopback
server. Random reads fetch nothing ahead; a fetch ahead that fails is no reader's error; `-o read_ahead=0`
turns it off."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np
import psutil
import pytest
import zarr

from shardfs.fs.readahead import ReadAhead
from shardfs.metrics import Metrics
from shardfs.shards.kv import Fetch
from shardfs.source import open_source
from tests.remote.test_remote_s3 import KEYS, credentials
from tests.support import peers
from tests.support.cli import scrape, shardfs
from tests.support.cloud import BUCKET, counted, moto_server, upload
from tests.support.daemons import daemon_of, remote_requests, wait_for
from tests.support.http_server import RangeServer

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


LATENCY = 0.02  # seconds a request: a network's, where read-ahead pays


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, dict[int, bytes]]:
    """600 values in one shard of 64 minishards (about 9 each), written by tensorstore."""
    root = tmp_path_factory.mktemp("read-ahead") / "kv"
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=6, shard_bits=0, data_encoding="gzip")
    items = {key: random.Random(key).randbytes(2000) for key in range(1, 601)}
    peers.write_tensorstore_kv(root, items, sharding=spec)
    return root, items


def figures(point: object) -> dict[str, float]:
    found = scrape(shardfs("stats", point, "--prometheus").stdout)
    return {
        dict(labels)["outcome"]: value
        for (name, labels), value in found.items()
        if name == "shardfs_read_ahead_chunks_total"
    }


def copy_in_listing_order(point: object, items: dict[int, bytes]) -> None:
    names = sorted(name for name in os.listdir(point) if name != "info")
    assert names == sorted(map(str, items))
    for name in names:  # as cp -r or a loop over os.listdir reads them: one file at a time
        assert (point / name).read_bytes() == items[int(name)], name  # type: ignore[operator]


def test_a_copy_in_listing_order_is_fetched_ahead(kv, mount) -> None:
    root, items = kv
    with RangeServer(root, latency=LATENCY).running() as server:
        m = mount(server.url)
        before = counted(server)
        copy_in_listing_order(m.path, items)
        asked = counted(server) - before
        gets = counted(server)["GET"]  # the mount's own, from its first
        seen = figures(m.path)
    assert seen.get("used", 0) >= 0.9 * len(items), seen  # nearly every file was there before it was read
    assert asked["GET"] <= len(items) + 70, asked  # each fetched once (and the window past the last file)
    found = scrape(shardfs("stats", m.path, "--prometheus").stdout)
    fetched, used = (
        found[("shardfs_read_ahead_bytes_total", frozenset({("outcome", o)}))] for o in ("fetched", "used")
    )
    assert fetched >= used > 1000 * seen["used"]  # 2000 bytes a value, gzip'd random bytes: no smaller
    reads, files = found[("shardfs_store_reads_total", frozenset())], found[("shardfs_files_read_total", frozenset())]
    assert files == len(items) and reads <= gets  # each store read is a GET (or more, retried)
    lines = dict(line.split(None, 1) for line in shardfs("stats", m.path).stdout.splitlines())
    assert lines["read-ahead"].startswith(f"{seen['fetched']:,.0f} files fetched ahead, {seen['used']:,.0f} read then;")
    assert f"({reads / files:,.2f} a file read)" in lines["store"]


def test_random_reads_fetch_nothing_ahead(kv, mount) -> None:
    root, items = kv
    names = sorted(map(str, items))
    random.Random(1).shuffle(names)
    with RangeServer(root).running() as server:
        m = mount(server.url)
        os.listdir(m.path)
        before = counted(server)
        for name in names[:200]:
            assert (m.path / name).read_bytes() == items[int(name)]
        asked = counted(server) - before
        off = mount(server.url, "-o", "read_ahead=0")
        os.listdir(off.path)
        before = counted(server)
        for name in names[:200]:
            assert (off.path / name).read_bytes() == items[int(name)]
        assert asked == counted(server) - before, asked  # not one request more than with read-ahead off
        assert figures(m.path).get("fetched", 0) == 0


def test_read_ahead_off_fetches_nothing_ahead(kv, mount) -> None:
    root, items = kv
    with RangeServer(root).running() as server:
        m = mount(server.url, "-o", "read_ahead=0")
        copy_in_listing_order(m.path, items)
        assert figures(m.path) == {}


def test_a_fetch_ahead_that_fails_is_no_readers_error(kv, mount) -> None:
    """The server answers 503 for a while in the middle of a copy (longer than the client retries within its
    timeout): the fetches ahead made meanwhile fail, and are counted; once the server answers again every file
    reads right, those whose fetch failed by the reader's own request. (While the server fails, the reader's
    own reads past what was fetched fail too: that is the server's error, not the read-ahead's.)"""
    root, items = kv
    with RangeServer(root, latency=LATENCY).running() as server:
        m = mount(server.url, "--timeout", "1")
        names = sorted(name for name in os.listdir(m.path) if name != "info")
        for name in names[:50]:
            assert (m.path / name).read_bytes() == items[int(name)]
        server.always = 503
        for name in names[50:150]:  # the window moves on while the server fails, and its fetches fail
            with contextlib.suppress(OSError):
                (m.path / name).read_bytes()
        assert wait_for(lambda: figures(m.path).get("failed", 0) > 0, 60), figures(m.path)
        server.always = None
        for name in names[50:]:
            assert (m.path / name).read_bytes() == items[int(name)], name


@pytest.fixture(scope="module")
def zarr_bucket(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A bucket holding a zarr v3 group written by zarr-python: `rows`, 4 x 2048 uint16 in inner chunks of 1 x 16
    and shards of one row (128 chunks of 32 bytes each), and `cols`, its transpose, whose N5 blocks nest the
    other way (N5 names x first): each has a directory of 128 chunk files, all of one shard."""
    root = tmp_path_factory.mktemp("read-ahead-zarr")
    group = zarr.open_group(root / BUCKET / "g.zarr", mode="w")
    data = np.arange(4 * 2048, dtype="uint16").reshape(4, 2048)
    for name, values, chunks, shards in (("rows", data, (1, 16), (1, 2048)), ("cols", data.T, (16, 1), (2048, 1))):
        group.create_array(name, shape=values.shape, dtype="uint16", chunks=chunks, shards=shards, compressors=None)[
            :
        ] = values
    return root


def widest(top: Path) -> tuple[Path, list[str]]:
    """The directory below top with the most files, and their names in listing order (as `cp -r` reads them)."""
    where, _, files = max(os.walk(top), key=lambda found: len(found[2]))
    return Path(where), sorted(files, key=os.fsencode)


@pytest.mark.parametrize(("view", "array"), [("native", "rows"), ("zarr2", "rows"), ("n5", "cols")])
def test_zarr_chunk_keys_and_views_read_in_listing_order_are_fetched_ahead_a_shard_at_a_time(
    zarr_bucket, mount, view, array
) -> None:  # fmt: skip
    """zarr-python's chunk keys (`c/0/17`), and the same chunks as the views show them (`0/17` or `0.17`, N5's
    `0/17` of the transpose): a copy of one directory in listing order has its chunks fetched ahead, the ranges
    of their one shard read together, so that the shard sees a few requests, not one a file; the bytes are those
    read with read-ahead off."""
    with RangeServer(zarr_bucket, latency=LATENCY, suffix_ranges=True).running() as server:  # as GCS does
        source = [f"gs://{BUCKET}/g.zarr", "--endpoint", server.url, "--anonymous", "--view", view]
        m, off = mount(*source), mount(*source, "-o", "read_ahead=0")
        where, names = widest(m.path / array)
        assert len(names) == 128, where
        shard = f"{BUCKET}/g.zarr/{array}/c/"
        before = server.gets(prefix=shard)
        copied = {name: (where / name).read_bytes() for name in names}
        ahead = server.gets(prefix=shard) - before
        before = server.gets(prefix=shard)
        twin = off.path / where.relative_to(m.path)
        assert copied == {name: (twin / name).read_bytes() for name in names}
        alone = server.gets(prefix=shard) - before
        seen = figures(m.path)
    assert alone >= len(names)  # read-ahead off: a request a file, at least
    assert ahead <= len(names) // 8, (ahead, alone)  # 16 files or more a request
    assert seen.get("used", 0) >= 0.8 * len(names), seen


@pytest.fixture(scope="module")
def lab_bucket(zarr_bucket: Path) -> Iterator[str]:
    """moto's S3 server on loopback, its endpoint: zarr_bucket's group uploaded twice, to `lab/a/g.zarr` and
    `lab/b/g.zarr`, under a prefix that is no dataset."""
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **credentials())
        client.create_bucket(Bucket=BUCKET)
        for name in ("a", "b"):
            upload(client, zarr_bucket / BUCKET / "g.zarr", f"lab/{name}/g.zarr")
        yield endpoint


def test_chunks_below_a_bucket_of_datasets_read_in_listing_order_are_fetched_ahead_a_shard_at_a_time(
    lab_bucket, mount, monkeypatch
) -> None:  # fmt: skip
    """A prefix holding two zarr groups, mounted whole: a copy of one directory of each one's chunks in listing
    order has them fetched ahead, the ranges of their one shard read together, as a mount of one group does: a
    few requests for the directory's 128 chunks, where read-ahead off costs a request a chunk."""
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    source = [f"s3://{BUCKET}/lab", "--endpoint", lab_bucket]
    m, off = mount(*source), mount(*source, "-o", "read_ahead=0")
    requests, copied = {}, {}
    for point in (m.path, off.path):
        for name in ("a", "b"):
            where, names = widest(point / name / "g.zarr" / "rows")
            assert len(names) == 128, where
            before = remote_requests(point)
            copied[point, name] = [(where / chunk).read_bytes() for chunk in names]
            requests[point, name] = (remote_requests(point) - before).total()
    for name in ("a", "b"):
        assert copied[m.path, name] == copied[off.path, name]
        assert requests[off.path, name] >= 128, requests  # read-ahead off: a request a chunk, at least
        assert requests[m.path, name] <= 128 // 8, requests  # 16 chunks or more a request
    assert figures(m.path).get("used", 0) >= 0.8 * 2 * 128, figures(m.path)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tensorstore volume one chunk deep, 16 x 16 chunks of 16 x 16 x 8 (sharded), and its unsharded twin."""
    root = tmp_path_factory.mktemp("read-ahead-plane")
    peers.write_tensorstore_volume(
        root / "v", size=(256, 256, 8), chunk=(16, 16, 8), voxel_offset=(0, 0, 0), extra_unsharded_scale=False,
        unsharded_twin=root / "twin",
    )  # fmt: skip
    return root / "v", root / "twin"


def window(x: int, y: int) -> list[str]:
    """The chunk files of an 8 x 8 window of the plane, its corner at chunk (x, y)."""
    return [f"{16 * a}-{16 * a + 16}_{16 * b}-{16 * b + 16}_0-8" for a in range(x, x + 8) for b in range(y, y + 8)]


def test_a_window_panned_across_a_volume_finds_the_next_chunks_fetched(plane, mount) -> None:
    """A viewer's pattern: 8 x 8 chunks read by 16 threads at once, then the window panned by 2 chunks, and
    again: the chunks past the window's edge along the way it moves are fetched before the window reaches them.
    Random chunks of the same volume fetch next to nothing ahead (three in a line, which starts it, are rare)."""
    source, twin = plane
    with RangeServer(source, latency=LATENCY).running() as server:
        m = mount(server.url)
        scale = m.path / "4_4_40"
        with ThreadPoolExecutor(16) as pool:
            for x in range(0, 9, 2):
                names = window(x, 0)
                assert list(pool.map(lambda n: (scale / n).read_bytes(), names)) == [
                    (twin / "4_4_40" / n).read_bytes() for n in names
                ]
        seen = figures(m.path)
        fresh = mount(server.url)
        names = sorted(os.listdir(twin / "4_4_40"))
        for name in random.Random(2).sample(names, 20):
            assert (fresh.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
        alone = figures(fresh.path)
    new = 4 * 16  # the chunks each pan brings into view
    assert seen.get("used", 0) >= 0.75 * new, seen
    assert seen["fetched"] <= 2 * (64 + new), seen  # the ring about the region read, not the volume
    assert alone.get("fetched", 0) <= 2, alone


def test_a_source_rewritten_mid_copy_gives_no_wrong_byte(tmp_path, mount) -> None:
    """tensorstore writes the shard again, with other values, while a copy in listing order is half done and
    fetches run ahead of it: every file reads as one version wrote it (fetched ahead of the rewrite: the old
    value, whole) or fails (EIO: its index's version is gone), never bytes of neither."""
    root = tmp_path / "kv"
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=6, shard_bits=0, data_encoding="gzip")
    old = peers.write_tensorstore_kv(root, {k: random.Random(k).randbytes(2000) for k in range(1, 601)}, sharding=spec)
    new = {k: random.Random(-k).randbytes(2100) for k in old}
    with RangeServer(root, latency=LATENCY).running() as server:
        m = mount(server.url)
        names = sorted(name for name in os.listdir(m.path) if name != "info")
        read: dict[str, bytes | int] = {}
        for i, name in enumerate(names):
            if i == 200:
                shutil.rmtree(root)
                peers.write_tensorstore_kv(root, new, sharding=spec)  # another ETag, other ranges
            try:
                read[name] = (m.path / name).read_bytes()
            except OSError as e:
                read[name] = e.errno  # type: ignore[assignment]
        seen = figures(m.path)
    wrong = [n for n, got in read.items() if got not in (old[int(n)], new[int(n)], errno.EIO)]
    assert not wrong, wrong[:5]
    assert seen.get("used", 0) > 100, seen  # read-ahead was at work across the rewrite


def test_an_unmount_while_fetches_run_ahead_leaves_no_thread_and_no_request(kv, tmp_path) -> None:
    """Fetches ahead at 200 ms a request when the mount is taken away: the daemon ends (nothing it started
    ahead keeps it) and, once it has, the server sees no request more."""
    root, items = kv
    point = tmp_path / "m"
    point.mkdir()
    with RangeServer(root, latency=0.2).running() as server:
        shardfs("mount", server.url, point, "--log-file", tmp_path / "log")
        pid = daemon_of(point).pid
        names = sorted(name for name in os.listdir(point) if name != "info")
        for name in names[:8]:  # the pattern holds: fetches ahead are under way
            assert (point / name).read_bytes() == items[int(name)]
        assert wait_for(lambda: server.in_flight > 0, 30)
        shardfs("unmount", point)
        assert wait_for(lambda: not psutil.pid_exists(pid), 60), "the daemon outlived its mount"
        assert wait_for(lambda: server.in_flight == 0, 30)  # answers to requests sent before it ended
        asked = sum(server.requests.values())
        time.sleep(1)
        assert sum(server.requests.values()) == asked


def test_a_file_read_while_its_fetch_ahead_is_under_way_is_counted_used_once_the_fetch_ends(raw_volume) -> None:
    """A read that begins while read-ahead fetches its file waits for those bytes (shards/kv.py): it is counted
    used, with the bytes fetched for it, once the fetch ends; one whose fetch failed is not. (Two fetches run by
    hand, over a tree of the raw volume, so that each read falls while its fetch is under way.)"""
    source, twin, _ = raw_volume
    tree = open_source(source, 1 << 20).tree
    scale = tree.locate("4_4_40")
    (number, key), failed = (tree.child(scale, p.name) for p in sorted((twin / "4_4_40").iterdir())[:2])
    metrics = Metrics()
    ahead = ReadAhead(tree, metrics, 64)

    def used() -> tuple[float | None, float | None]:
        sample = metrics.registry.get_sample_value
        return (
            sample("shardfs_read_ahead_chunks_total", {"outcome": "used"}),
            sample("shardfs_read_ahead_bytes_total", {"outcome": "used"}),
        )

    def under_way(place: tuple[int, int], answer: dict | Exception) -> threading.Event:
        """A fetch of place's key that has begun and ends, with answer, once the event returned is set."""
        started, go = threading.Event(), threading.Event()

        def run() -> dict:
            started.set()
            assert go.wait(30)
            if isinstance(answer, Exception):
                raise answer
            return answer

        assert ahead._fetch(place[0], Fetch([place[1]], run))
        assert started.wait(30)
        return go

    ends = [under_way((number, key), {key: 1234}), under_way(failed, OSError("the server went away"))]
    ahead.read(number, key)
    ahead.read(*failed)
    assert used() == (None, None)  # the bytes are still on their way
    for go in ends:
        go.set()
    assert ahead._pool is not None
    ahead._pool.shutdown(wait=True)  # both fetches ended, and what they fetched was counted
    assert used() == (1, 1234)
