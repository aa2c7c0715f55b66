"""Sources on a web server: datasets written by tensorstore, served over loopback with Range and ETag, mounted
by URL, read back through the kernel by peers; requests counted per chunk; server failures as errno."""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import socket
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr
from cloudvolume import CloudVolume

from shardfs.formats.zarr import named_children
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.daemons import daemon_of, peak_and_now_kib
from tests.support.http_server import RangeServer
from tests.support.reading import chunk_names, errno_of, forget_pages, read_errno

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


TIMEOUT = "2"  # seconds, for the failure tests: a hung request must be EIO well before a test's patience ends
# A failure test's patience: half the default --timeout (30 s), so that a --timeout not applied is caught, and
# many times TIMEOUT, so that a loaded machine cannot eat it. Each attempt's own length is checked in the log.
PATIENCE = 15.0


@pytest.fixture
def volume(raw_volume: tuple[Path, Path, np.ndarray]) -> tuple[Path, Path, np.ndarray]:
    """Raw chunks: one read is one GET."""
    return raw_volume


@pytest.fixture
def server(volume) -> RangeServer:
    with RangeServer(volume[0]).running() as s:
        yield s


def test_precomputed_over_http_reads_as_unsharded(volume, server, mount) -> None:
    _, twin, expected = volume
    m = mount(f"precomputed://{server.url}")
    assert "info" in os.listdir(m.path) and (m.path / "info").is_file()
    names = chunk_names(twin, "4_4_40")
    assert len(names) > 10
    # HTTP cannot list: a sharded directory lists from the shards the spec names, each probed with a HEAD.
    assert sorted(os.listdir(m.path / "4_4_40")) == names
    for name in names:
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    assert json.loads((m.path / "info").read_text()) == json.loads((twin / "info").read_text())
    for where, _, files in os.walk(m.path):  # a web server says nothing of modes: read bits, never a program
        assert stat.S_IMODE(os.stat(where).st_mode) == 0o555, where
        for name in files:
            path = os.path.join(where, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o444 and not os.access(path, os.X_OK), path
    spec = {"driver": "neuroglancer_precomputed", "kvstore": f"file://{m.path}", "scale_index": 0}
    assert np.array_equal(ts.open(spec).result().read().result(), expected)
    cv = CloudVolume(f"file://{m.path}", mip=0, fill_missing=True, progress=False)
    assert np.array_equal(np.asarray(cv[cv.bounds]), expected)
    assert not (m.path / "4_4_40" / "0-16_0-16_0-8").exists()  # not a chunk of this volume: ENOENT


def test_one_get_per_chunk_once_warm(volume, server, mount) -> None:
    """Cold, a chunk costs at most 2 GETs (minishard index, data) and a shard one more (its whole shard index,
    whose answer names the shard's version: no HEAD); once the indexes are cached, exactly one: the second
    pass runs after the kernel's page cache is dropped (the mount uses FUSE no_open, so the kernel would
    otherwise answer it all by itself). A chunk whose bytes came with its minishard's index and are still held
    costs none."""
    _, twin, _ = volume
    m = mount(server.url)
    names = chunk_names(twin, "4_4_40")
    before = server.gets(".shard")
    for name in names:
        (m.path / "4_4_40" / name).read_bytes()
    cold = server.gets(".shard") - before
    shards = {peers.volume_chunk_shards(volume[0], "4_4_40")[n] for n in names}
    assert cold <= 2 * len(names) + len(shards)
    assert not [path for (method, path) in server.requests if method == "HEAD" and path.endswith(".shard")]
    forget_pages(*(m.path / "4_4_40" / name for name in names))
    before = server.gets(".shard")
    for name in names:
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
    assert server.gets(".shard") - before <= len(names)  # at most 1.00 GET per chunk, warm
    figures = shardfs("stats", m.path, "--prometheus").stdout
    assert f'shardfs_remote_requests_total{{outcome="ok",request="get"}} {float(server.gets())}' in figures
    assert 'shardfs_remote_request_seconds_count{request="head"}' in figures


def test_sixteen_readers_overlap(volume, server, mount) -> None:
    """With 0.5 s per request, 16 readers have their GETs at the server at once: their reads overlap (what the
    server saw, not how long they took, which load can stretch). Lookups are stat'ed first, so that it is the
    reads, one GET each at most (none where the bytes came with a minishard's index), that are counted."""
    _, twin, _ = volume
    m = mount(server.url)
    names = chunk_names(twin, "4_4_40")
    for name in names:
        (m.path / "4_4_40" / name).stat()
    server.latency = 0.5
    server.most_in_flight = 0
    before = server.gets()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: (m.path / "4_4_40" / n).read_bytes(), names))
    assert server.gets() - before <= len(names)
    assert server.most_in_flight >= 8, server.most_in_flight


def test_retried_failures_then_success(volume, server, mount) -> None:
    _, twin, _ = volume
    m = mount(server.url, "--timeout", "10")
    name = chunk_names(twin, "4_4_40")[0]
    shard = "4_4_40/" + peers.volume_chunk_shards(volume[0], "4_4_40")[name]
    server.fail[shard] = [429, 503, 429, 503]
    assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()
    assert server.fail[shard] == []


def test_server_errors_are_eio_never_enoent(volume, server, mount) -> None:
    _, twin, _ = volume
    m = mount(server.url, "--timeout", TIMEOUT)
    names = chunk_names(twin, "4_4_40")
    server.always = 503
    started = time.monotonic()
    assert read_errno(m.path / "4_4_40" / names[0]) == errno.EIO
    assert time.monotonic() - started < PATIENCE
    server.always = 403
    assert read_errno(m.path / "4_4_40" / names[-1]) == errno.EACCES
    server.always = None
    assert "access denied" in m.log_text() and server.url in m.log_text()


def test_missing_shard_is_enoent(volume, tmp_path, mount) -> None:
    source, twin, _ = volume
    shards = peers.volume_chunk_shards(volume[0], "4_4_40")
    name, shard = next(iter(shards.items()))
    with RangeServer(source).running() as server:
        server.fail[f"4_4_40/{shard}"] = [404] * 100  # the shard is gone: its chunks are absent
        m = mount(server.url)
        assert read_errno(m.path / "4_4_40" / name) == errno.ENOENT
        other = next(n for n, s in shards.items() if s != shard)
        assert (m.path / "4_4_40" / other).read_bytes() == (twin / "4_4_40" / other).read_bytes()


def test_hung_server_is_eio_within_the_timeout(volume, server, mount) -> None:
    _, twin, _ = volume
    m = mount(server.url, "--timeout", TIMEOUT)
    server.hang = True
    started = time.monotonic()
    assert read_errno(m.path / "4_4_40" / chunk_names(twin, "4_4_40")[0]) == errno.EIO
    assert time.monotonic() - started < PATIENCE
    assert "failed" in m.log_text()


def test_unreachable_source_is_refused_in_one_line(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    point = tmp_path / "m"
    point.mkdir()
    url = f"http://127.0.0.1:{port}/data"
    r = shardfs("mount", url, point, "--timeout", TIMEOUT, "--log-file", tmp_path / "log", check=False)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"shardfs: {url}: cannot be reached ("), r.stderr
    assert "check the URL" in r.stderr and "zarr.json" not in r.stderr.partition("(")[0]
    r = shardfs("info", url, "--timeout", TIMEOUT, check=False)  # said once, not logged and then said again
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot be reached" in r.stderr, r.stderr
    with RangeServer(tmp_path).running() as server:  # reachable, but no dataset there
        r = shardfs("ls", f"{server.url}/nothing", check=False)
        assert r.returncode == 2 and "neither 'zarr.json'" in r.stderr and server.url in r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.rstrip().endswith("name a dataset"), r.stderr


def test_zarr_array_over_http(tmp_path, mount) -> None:
    """A tensorstore zarr v3 sharded array: every shard costs one GET of its index (a suffix range, no HEAD)
    and every inner chunk one GET, and zarr-python and tensorstore read the mount."""
    root = tmp_path / "a.zarr"
    data = np.arange(40 * 36, dtype=np.uint16).reshape(40, 36)
    peers.create_tensorstore_zarr3(root, [40, 36], "uint16", [20, 18], [5, 6]).write(data).result()
    with RangeServer(root, suffix_ranges=True).running() as server:
        m = mount(f"zarr3://{server.url}")
        chunks = [f"c/{i}/{j}" for i in range(8) for j in range(6)]
        for name in chunks:
            i, j = map(int, name.split("/")[1:])
            assert np.array_equal(
                np.frombuffer((m.path / name).read_bytes(), "<u2").reshape(5, 6),
                data[i * 5 : i * 5 + 5, j * 6 : j * 6 + 6],
            )
        # One index per shard, then a GET per chunk at most (fewer where chunks read in a line were fetched
        # ahead together).
        assert server.gets(prefix="c/") <= len(chunks) + 4
        assert not [path for (method, path) in server.requests if method == "HEAD" and path.startswith("c/")]
        got = ts.open({"driver": "zarr3", "kvstore": f"file://{m.path}"}).result().read().result()
        assert np.array_equal(got, data)
        # HTTP cannot list, but the 2 x 2 shard grid is probed: `ls` and `cp -r` see every chunk key.
        listed = sorted(os.path.relpath(os.path.join(top, f), m.path) for top, _, fs in os.walk(m.path) for f in fs)
        assert listed == sorted([*chunks, "zarr.json"])


def test_a_zarr_array_over_http_lists_what_its_probed_shards_hold(tmp_path, mount) -> None:
    """A shard missing from the grid lists nothing, and reads ENOENT; a grid of more than PROBED_SHARDS shards is
    not probed (it lists empty, one WARNING), while its chunks are still found by name."""
    data = np.arange(40 * 36, dtype=np.uint16).reshape(40, 36)
    peers.create_tensorstore_zarr3(tmp_path / "a.zarr", [40, 36], "uint16", [20, 18], [5, 6]).write(data).result()
    (tmp_path / "a.zarr" / "c" / "1" / "1").unlink()  # the shard of rows 20-39, columns 18-35
    wide = peers.create_tensorstore_zarr3(tmp_path / "wide.zarr", [4, 4100], "uint8", [1, 1], [1, 1])
    wide[0, 7].write(7).result()
    with RangeServer(tmp_path, suffix_ranges=True).running() as server:
        m = mount(f"zarr3://{server.url}/a.zarr")
        assert sorted(os.listdir(m.path / "c" / "1")) == ["0", "1", "2", "3", "4", "5"]
        assert sorted(os.listdir(m.path / "c" / "4")) == ["0", "1", "2"]  # rows 4-7: one of their shards is gone
        assert errno_of(m.path / "c" / "4" / "3") == errno.ENOENT
        w = mount(f"zarr3://{server.url}/wide.zarr")
        assert os.listdir(w.path) == ["zarr.json"]
        assert (w.path / "c" / "0" / "7").read_bytes() == b"\x07"
        assert "shards to probe, more than 4096: not listed" in w.log_text()


def test_ome_zarr_hierarchy_over_http_is_walked_from_its_metadata(tmp_path, mount) -> None:
    """HTTP cannot list: a group's children are the datasets its OME-Zarr multiscales name (or the keys of
    its consolidated metadata), and zarr-python reads them through the mount."""
    root = tmp_path / "ome.zarr"
    group = zarr.open_group(root, mode="w")
    scales = {
        "0": np.arange(32 * 30, dtype="uint16").reshape(32, 30),
        "1": np.arange(16 * 15, dtype="uint16").reshape(16, 15),
    }
    for path, data in scales.items():
        group.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(4, 5), shards=(8, 15))[...] = data
    ome = {
        "version": "0.5",
        "multiscales": [{"axes": [{"name": "y"}, {"name": "x"}], "datasets": [{"path": p} for p in scales]}],
    }
    group.attrs["ome"] = ome
    with RangeServer(root).running() as server:
        m = mount(server.url)
        back = zarr.open_group(m.path, mode="r", use_consolidated=False)
        for path, data in scales.items():
            assert back[path].shards is None and np.array_equal(back[path][...], data), path
        # Listed: the metadata files it was walked from, as files; the chunks below them: said not to be.
        assert sorted(os.listdir(m.path)) == ["0", "1", "zarr.json"]
        assert {e.name: e.is_file() for e in os.scandir(m.path)} == {"0": False, "1": False, "zarr.json": True}
        assert [(e.name, e.is_file()) for e in os.scandir(m.path / "0") if e.name == "zarr.json"] == [
            ("zarr.json", True)
        ]
        assert m.log_text().count("event=unlisted") == 1 and "cannot list directories" in m.log_text()
        assert "note: a web server cannot list directories" in shardfs("info", server.url).stdout
    assert named_children({"consolidated_metadata": {"metadata": {"a": {}, "a/b": {}, "c/d": {}}}}) == ["a", "c"]
    assert named_children({"attributes": {"multiscales": [{"datasets": [{"path": "s0"}, {"path": "../x"}]}]}}) == ["s0"]


def test_arrays_nested_in_subgroups_are_listed_from_the_roots_consolidated_metadata(tmp_path, mount) -> None:
    """The root's consolidated metadata names `sub/arr` and `sub/deeper/arr`; the subgroups have none of
    their own. Over HTTP both are listed and in `shardfs info`, as over a store that lists."""
    root = tmp_path / "c.zarr"
    group = zarr.open_group(root, mode="w")
    data = np.arange(12 * 10, dtype="int16").reshape(12, 10)
    for path in ("top", "sub/arr", "sub/deeper/arr"):
        group.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(3, 5), shards=(6, 10))[...] = data
    zarr.consolidate_metadata(root)
    subgroup = json.loads((root / "sub" / "zarr.json").read_text())
    assert not subgroup.get("consolidated_metadata"), "zarr-python now consolidates subgroups too"
    with RangeServer(root).running() as server:
        m = mount(server.url)
        assert sorted(os.listdir(m.path / "sub")) == ["arr", "deeper", "zarr.json"]
        assert sorted(os.listdir(m.path / "sub" / "deeper")) == ["arr", "zarr.json"]
        info = shardfs("info", server.url).stdout
        for path in ("top", "sub/arr", "sub/deeper/arr"):
            assert f"{path}: zarr v3 array, sharded" in info, path
        back = zarr.open_group(m.path, mode="r", use_consolidated=False)
        assert np.array_equal(back["sub/deeper/arr"][...], data)


def test_a_node_no_metadata_names_is_found_by_name_over_http(tmp_path, mount) -> None:
    """zarr-python 3's default group names its children nowhere (no consolidated metadata, no OME): over a
    server that answers 404 for directories, as object stores do, its array is still reached by name, its
    files served as stored, and zarr-python reads it through the mount."""
    root = tmp_path / "g.zarr"
    group = zarr.open_group(root, mode="w", zarr_format=3)
    data = np.arange(12 * 10, dtype="int16").reshape(12, 10)
    group.create_array("t", shape=data.shape, dtype=data.dtype, chunks=(3, 5), shards=(6, 10))[...] = data
    assert "consolidated_metadata" not in json.loads((root / "zarr.json").read_text()) or json.loads(
        (root / "zarr.json").read_text())["consolidated_metadata"] is None  # fmt: skip
    with RangeServer(root).running() as server:
        m = mount(server.url)
        assert os.listdir(m.path) == ["zarr.json"]  # nothing names `t`
        assert (m.path / "t" / "zarr.json").read_bytes() == (root / "t" / "zarr.json").read_bytes()
        assert np.array_equal(zarr.open_group(m.path, mode="r", use_consolidated=False)["t"][...], data)
        assert not (m.path / "u").exists()  # a name with no zarr.json below it is absent
        # Inside it, only what a chunk key's directory can be named is taken for one (the shard below decides);
        # made-up names are absent, not directories remembered for each.
        assert (m.path / "t" / "c" / "0" / "0").read_bytes() == (root / "t" / "c" / "0" / "0").read_bytes()
        assert not (m.path / "t" / "made-up").exists() and not (m.path / "t" / "c" / "x").exists()
        assert (m.path / "t" / "c" / "9").is_dir()  # a grid position past the array: no object can say otherwise


def test_cache_dir_serves_a_later_mount_and_stays_in_budget(volume, server, mount, tmp_path) -> None:
    """--cache-dir keeps every range read (indexes and chunks) on disk: a second mount reads the same
    chunks with no GET at all; a small --cache-dir-size is kept to."""
    _, twin, _ = volume
    names = chunk_names(twin, "4_4_40")
    cache = tmp_path / "cache"
    # Read-ahead off: what it fetches (whole minishards as their average decides, chunks next to a line read)
    # depends on timing, so another mount's ranges may miss those kept on disk (README, Known limits).
    first = mount(server.url, "--cache-dir", cache, "-o", "read_ahead=0")
    for name in names:
        (first.path / "4_4_40" / name).read_bytes()
    shardfs("unmount", first.path)
    before = server.gets()
    second = mount(server.url, "-o", f"cache_dir={cache},read_ahead=0")
    for name in names:
        assert (second.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    # each object's current version is asked once: `info` by a HEAD, a shard by the GET of its shard index
    # (its version is not known before that answer, so the disk cannot answer it); every other range comes
    # from the disk
    shards = {peers.volume_chunk_shards(volume[0], "4_4_40")[n] for n in names}
    assert server.gets() - before == len(shards)
    small = tmp_path / "small"
    third = mount(server.url, "--cache-dir", small, "--cache-dir-size", "64K")
    for name in names:
        assert (third.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
    assert 0 < sum(p.stat().st_size for p in small.iterdir()) <= 64 << 10


def test_gzip_chunks_of_raw_voxels_are_stated_without_their_data(tmp_path, mount) -> None:
    """A gzip chunk of raw voxels has its size from the grid (clipped at the edges, channels included):
    a lookup reads indexes only, never the chunk alone (a minishard's chunks may come with its index, in the
    same GET); each read then costs one GET at most, and the bytes are the unsharded twin's."""
    source, twin = tmp_path / "src", tmp_path / "twin"
    peers.write_tensorstore_volume(source, dtype="uint16", num_channels=2, data_encoding="gzip", unsharded_twin=twin)
    with RangeServer(source).running() as server:
        m = mount(server.url)
        names = chunk_names(twin, "4_4_40")
        before = server.gets(".shard")
        for name in names:
            assert (m.path / "4_4_40" / name).stat().st_size == (twin / "4_4_40" / name).stat().st_size, name
        indexes = server.gets(".shard") - before
        assert indexes < len(names) / 2, indexes
        before = server.gets(".shard")
        for name in names:
            assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes(), name
        assert server.gets(".shard") - before <= len(names)


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("extra", 256 << 20, "longer than asked"),
        ("extra", -10, "shorter than asked: truncated"),
        ("gzip", True, "compressed by the server (Content-Encoding gzip)"),
    ],
    ids=["longer", "shorter", "gzip"],
)
def test_a_wrong_answer_is_eio_naming_its_cause_and_costs_no_more_than_asked(
    volume, server, mount, setting, value, named
) -> None:
    """A range answered with 256 MiB more than asked (made as it is sent), 10 bytes fewer, or compressed on
    the way: EIO, the log line saying which, and the daemon's peak memory grows by far less than the excess
    (the body is read no further than one byte past the range)."""
    _, twin, _ = volume
    m = mount(server.url)
    name, other = chunk_names(twin, "4_4_40")[:2]
    (m.path / "4_4_40" / name).stat()  # its indexes read: the read is one GET of the chunk
    # A read that succeeds first: the daemon's read path (its pool of readers, the client's buffers) is made
    # before the peak is taken, and only what the wrong answer costs is measured.
    assert (m.path / "4_4_40" / other).read_bytes() == (twin / "4_4_40" / other).read_bytes()
    pid = daemon_of(m.path).pid
    before, _ = peak_and_now_kib(pid)
    setattr(server, setting, value)
    assert read_errno(m.path / "4_4_40" / name) == errno.EIO
    peak, _ = peak_and_now_kib(pid)
    assert peak - before < 4 << 10, (peak, before)  # KiB: not even a 10 MiB buffer (obstore's default chunk)
    errors = [line for line in m.log_text().splitlines() if "level=error" in line]
    assert errors and all(named in line for line in errors), errors
    assert named.endswith("truncated") or not any("truncated" in line for line in errors)


def test_a_stored_content_encoding_is_taken_as_stored(volume, server, mount) -> None:
    """An object stored with a Content-Encoding (S3 sends it with every answer, the bytes as stored): its
    ranges are the stored bytes, of the length asked, and are read; only a body of another length is refused."""
    _, twin, _ = volume
    server.content_encoding = "gzip"
    m = mount(server.url)
    for name in chunk_names(twin, "4_4_40"):
        assert (m.path / "4_4_40" / name).read_bytes() == (twin / "4_4_40" / name).read_bytes()


def test_names_no_object_can_have_are_enoent_and_never_sent(volume, server, mount) -> None:
    """Control characters and bytes that are not UTF-8 cannot be in an object's key: such a name is absent,
    at the top (passed through to the source) and in a scale's directory, with no request and no error."""
    m = mount(server.url)
    (m.path / "4_4_40").stat()
    before = server.requests.copy()
    root = os.fsencode(m.path)
    for name in (b"bad\x01name", b"tab\tname", b"del\x7f", b"latin1-\xe9t\xe9", b"\xff"):
        for parent in (b"", b"4_4_40/"):
            with pytest.raises(FileNotFoundError):
                os.stat(root + b"/" + parent + name)
    assert server.requests == before
    assert "level=error" not in m.log_text(), m.log_text()


def test_timeout_gives_each_attempt_half(volume, mount) -> None:
    """--timeout 3: every attempt may take 1.5 s, and the last retry starts by then. A server answering in
    1 s is served (with a quarter per attempt it refused the mount); one answering in 2 s, faster than
    --timeout but slower than an attempt's share, is EIO within --timeout."""
    source, twin, _ = volume
    names = chunk_names(twin, "4_4_40")
    with RangeServer(source, latency=1.0).running() as server:
        m = mount(server.url, "--timeout", "3")
        assert (m.path / "4_4_40" / names[0]).read_bytes() == (twin / "4_4_40" / names[0]).read_bytes()
        server.latency = 2.0
        started = time.monotonic()
        assert read_errno(m.path / "4_4_40" / names[-1]) == errno.EIO
        assert time.monotonic() - started < PATIENCE
        attempts = [float(t) for t in re.findall(r" in ([0-9.]+)s - HTTP error", m.log_text())]
        assert attempts and all(1.4 < t < 2.9 for t in attempts), m.log_text()  # half of --timeout each, not all


def test_a_large_value_is_read_in_pieces_of_piece_size(tmp_path, mount) -> None:
    """A 12 MiB gzip chunk file of an unsharded precomputed volume, shown by the zarr v2 view, is decoded as it
    is read: GETs of exactly 8 MiB, the remote store's piece size, then the rest; never the whole at once,
    nor smaller pieces."""
    voxels = np.random.default_rng(5).integers(0, 1 << 32, (48, 256, 256), dtype=np.uint32)
    info = {
        "@type": "neuroglancer_multiscale_volume", "type": "image", "data_type": "uint32", "num_channels": 1,
        "scales": [{
            "key": "s0", "size": [256, 256, 48], "resolution": [1, 1, 1], "voxel_offset": [0, 0, 0],
            "chunk_sizes": [[256, 256, 48]], "encoding": "raw",
        }],
    }  # fmt: skip
    (tmp_path / "s0").mkdir()
    (tmp_path / "info").write_text(json.dumps(info))
    stored = gzip.compress(voxels.tobytes(), compresslevel=1)
    assert len(stored) > 8 << 20
    (tmp_path / "s0" / "0-256_0-256_0-48.gz").write_bytes(stored)
    with RangeServer(tmp_path).running() as server:
        m = mount(server.url, "--view", "zarr2")
        assert (m.path / "s0" / "0/0/0/0").read_bytes() == voxels.tobytes()
        got = set(server.ranges) - {f"bytes=0-{(tmp_path / 'info').stat().st_size - 1}"}
        assert got == {f"bytes=0-{(8 << 20) - 1}", f"bytes={8 << 20}-{len(stored) - 1}"}, got
