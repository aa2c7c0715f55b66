"""Cold reads of a remote source cost few round trips: a shard is opened by the GET of its shard index (the
answer names its size and version: no HEAD first; a zarr shard's index at its end by a suffix range), a
shard's minishard indexes written next to each other come in one GET, and a listing keeps many index
requests in flight. Counted on the loopback server, whose datasets are written by tensorstore, cloud-volume
and zarr-python."""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ShardingCodec

from shardfs.shards.listing import LISTING_BUDGET
from tests.support import peers
from tests.support.cloud import counted
from tests.support.datasets import home
from tests.support.http_server import RangeServer
from tests.support.peers import write_cloudvolume_kv
from tests.support.reading import chunk_names, read_errno

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


BUCKET = "bkt"
SCALE = "4_4_40"


def test_a_cold_chunk_costs_three_gets_and_no_head(raw_volume, mount) -> None:
    """A fresh mount of a tensorstore volume reads one chunk with 3 GETs and no HEAD: the shard index (its
    answer's Content-Range and ETag pin the shard's size and version), the chunk's minishard index
    (tensorstore writes each after its minishard's chunks, so alone), the chunk. Today's code sent a HEAD
    first for the version."""
    source, twin, _ = raw_volume
    name = chunk_names(twin, SCALE)[0]
    with RangeServer(source).running() as server:
        m = mount(server.url)
        before = counted(server)
        assert (m.path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes()
        cold = counted(server) - before
    assert cold == Counter({"GET": 3}), cold


def minishard_rows(shard: Path, minishard_bits: int) -> list[tuple[int, int]]:
    data = shard.read_bytes()
    return [struct.unpack_from("<QQ", data, 16 * i) for i in range(1 << minishard_bits)]


def test_minishard_indexes_side_by_side_cost_one_get(tmp_path, mount) -> None:
    """cloud-volume writes a shard's minishard indexes side by side: reading one key from each of its 8
    minishards costs the shard index, one GET for all 8 minishard indexes, and one GET a key (10), where
    reading them one at a time would cost 8 more (and a HEAD)."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=3, shard_bits=1, data_encoding="raw")
    items = {key: f"value of {key}".encode() * 3 for key in range(1, 400)}
    write_cloudvolume_kv(tmp_path / "kv", spec, items)
    rows = sorted(r for r in minishard_rows(tmp_path / "kv" / "0.shard", 3) if r[0] != r[1])
    assert len(rows) == 8 and all(a[1] == b[0] for a, b in itertools.pairwise(rows))  # side by side
    one_each = {}
    for key in items:
        shard, minishard = home(spec, key)
        if shard == 0:
            one_each.setdefault(minishard, key)
    assert len(one_each) == 8
    with RangeServer(tmp_path / "kv").running() as server:
        m = mount(server.url)
        before = counted(server)
        for key in one_each.values():
            assert (m.path / str(key)).read_bytes() == items[key]
        cold = counted(server) - before
        assert server.gets("1.shard") == 0
    assert cold == Counter({"GET": 2 + len(one_each)}), cold


@pytest.mark.parametrize("writer", ["tensorstore", "cloud-volume"])
def test_a_listing_keeps_many_index_reads_in_flight(tmp_path, mount, writer) -> None:
    """Listing a directory of 16 shards of 8 minishards from a bucket at 50 ms a request: the shards are
    opened, and their minishard indexes read, many at a time (the server sees more than 8 requests at once;
    one at a time it would see 1), each index once; names list in one order, the same when listed again."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=3, shard_bits=4, data_encoding="raw")
    items = {key: f"value of {key}".encode() for key in range(1, 2000)}
    root = tmp_path / BUCKET / "kv"
    if writer == "tensorstore":
        peers.write_tensorstore_kv(root, items, sharding=spec)
    else:
        write_cloudvolume_kv(root, spec, items)
    shards = sorted(root.glob("*.shard"))
    minishards = sum(sum(a != b for a, b in minishard_rows(s, 3)) for s in shards)
    with RangeServer(tmp_path, latency=0.05).running() as server:
        m = mount(f"gs://{BUCKET}/kv", "--endpoint", server.url, "--anonymous")
        before, gets = counted(server), server.gets(".shard")
        server.most_in_flight = 0
        listed = os.listdir(m.path)
        cold, gets = counted(server) - before, server.gets(".shard") - gets
        assert server.most_in_flight > 8, server.most_in_flight
        again = os.listdir(m.path)
    assert sorted(listed) == sorted([*map(str, items), "info"]) and again == listed
    # a GET a shard (its index), then one a minishard, or one a shard for all of its side by side
    assert gets == len(shards) + (minishards if writer == "tensorstore" else len(shards)), cold
    assert "HEAD" not in cold, cold


def test_a_listing_in_flight_stays_within_its_budget(tmp_path, mount) -> None:
    """A minishard bomb: 4,096 minishard entries that each claim the same 1 MiB, which lists no name. The
    listing reads them many at a time, yet no more than its budget allows (64 MiB: the 64 KiB shard index,
    then 63 of them), and says once that it stopped."""
    root = tmp_path / "kv"
    root.mkdir()
    spec = peers.sharding_spec(preshift_bits=0, hash="identity", minishard_bits=12, shard_bits=0,
                               minishard_index_encoding="raw", data_encoding="raw")  # fmt: skip
    (root / "info").write_text(json.dumps({"sharding": spec}))
    claimed = 1 << 20
    (root / "0.shard").write_bytes(struct.pack("<QQ", 0, claimed) * 4096 + bytes(claimed))
    with RangeServer(root, latency=0.05).running() as server:
        m = mount(server.url)
        before = server.gets("0.shard")
        assert os.listdir(m.path) == ["info"]
        assert server.gets("0.shard") - before == 1 + (LISTING_BUDGET - (16 << 12)) // claimed
        assert server.most_in_flight > 8, server.most_in_flight
    assert m.log_text().count("event=listing_budget") == 1


# ---------------------------------------------------------------------------------------------------------------------
# Zarr v3: a shard's index at its end comes in one suffix GET


SHAPE, SHARD, INNER = (24, 20, 16), (12, 10, 8), (4, 5, 4)
ZARR_INDEX = 16 * 3 * 2 * 2 + 4  # (offset, nbytes) per inner chunk of a shard, and its crc32c


def write_sharded_zarr(root: Path, writer: str, index_location: str = "end", keys: str = "default") -> np.ndarray:
    """A 3-d sharded zarr v3 array of raw uint16 inner chunks, written whole by tensorstore or zarr-python
    (keys: its chunk_key_encoding there); its contents as zarr-python reads them from the source."""
    data = np.arange(math.prod(SHAPE), dtype=np.uint16).reshape(SHAPE)
    if writer == "tensorstore":
        peers.create_tensorstore_zarr3(root, list(SHAPE), "uint16", list(SHARD), list(INNER),
                                       index_location=index_location).write(data).result()  # fmt: skip
    else:
        serializer = ShardingCodec(chunk_shape=INNER, index_location=index_location)
        array = zarr.create_array(root, shape=SHAPE, chunks=SHARD, dtype="uint16", serializer=serializer,
                                  compressors=None, chunk_key_encoding={"name": keys})  # fmt: skip
        array[...] = data
    return zarr.open_array(root, mode="r")[...]


def inner_chunk(written: np.ndarray, pos: tuple[int, ...]) -> bytes:
    return written[tuple(slice(p * c, p * c + c) for p, c in zip(pos, INNER, strict=True))].tobytes()


def shard_ranges(server: RangeServer) -> list[str | None]:
    """The Range headers of the GETs so far; only shards are read after mounting."""
    with server.lock:
        return list(server.ranges)


@pytest.mark.parametrize(
    ("writer", "where", "chunk", "first_range"),
    [
        ("tensorstore", "end", (0, 0, 0), f"bytes=-{ZARR_INDEX}"),
        ("zarr-python", "end", (0, 0, 0), f"bytes=-{ZARR_INDEX}"),
        ("zarr-python", "start", (1, 1, 1), f"bytes=0-{ZARR_INDEX - 1}"),
    ],
)
def test_a_cold_zarr_chunk_costs_two_gets_and_no_head(tmp_path, mount, writer, where, chunk, first_range) -> None:
    """A fresh mount of a 3-d sharded zarr v3 array reads a chunk of its first shard with 2 GETs and no HEAD,
    as tensorstore does: the GET of the shard's index (a suffix range `bytes=-196` when the index is at the
    end, the first 196 bytes with index_location "start"), whose Content-Range and ETag pin the shard's size
    and version, and the GET of the chunk. The lookups of c, c/0 and c/0/0 on the way are answered from that
    same index. Before, a HEAD went first to learn the shard's size."""
    written = write_sharded_zarr(tmp_path / "a", writer, index_location=where)
    with RangeServer(tmp_path / "a", suffix_ranges=True).running() as server:
        m = mount(f"zarr3://{server.url}")
        before, ranges = counted(server), len(shard_ranges(server))
        assert (m.path / "c" / "/".join(map(str, chunk))).read_bytes() == inner_chunk(written, chunk)
        cold = counted(server) - before
        assert shard_ranges(server)[ranges] == first_range
    assert cold == Counter({"GET": 2}), cold


def test_a_server_without_suffix_ranges_is_asked_once(tmp_path, mount) -> None:
    """A server that answers a suffix range with the whole object (obstore refuses such an answer unread):
    the first shard costs that GET, then a HEAD and the GET of its index; later shards a HEAD and a GET, as
    before; the bytes are right, and the log says once why."""
    written = write_sharded_zarr(tmp_path / "a", "zarr-python")
    with RangeServer(tmp_path / "a").running() as server:
        m = mount(f"zarr3://{server.url}")
        before = counted(server)
        for pos in [(0, 0, 0), (0, 0, 2)]:  # shards c/0/0/0 and c/0/0/1
            assert (m.path / "c" / "/".join(map(str, pos))).read_bytes() == inner_chunk(written, pos)
        cold = counted(server) - before
    assert cold == Counter({"GET": 1 + 2 * 2, "HEAD": 2}), cold
    assert m.log_text().count("event=no_suffix_ranges") == 1


def test_a_zarr_shard_shorter_than_its_index_is_eio_naming_it(tmp_path, mount) -> None:
    """A shard of 10 bytes: the suffix GET answers all of it, which is no index: EIO, the log naming the
    shard, and no HEAD was needed to find out. (Keys `0.0.0`: a lookup reads the chunk's own shard.)"""
    write_sharded_zarr(tmp_path / "a", "zarr-python", keys="v2")
    (tmp_path / "a/0.0.0").write_bytes(b"0123456789")
    with RangeServer(tmp_path / "a", suffix_ranges=True).running() as server:
        m = mount(f"zarr3://{server.url}")
        before = counted(server)
        assert read_errno(m.path / "0.0.1") == errno.EIO
        cold = counted(server) - before
    assert cold == Counter({"GET": 1}), cold
    assert "shard=0.0.0 " in m.log_text() and "shorter than its 196-byte index" in m.log_text()


def test_a_suffix_answer_longer_than_asked_is_cut_off(tmp_path, mount) -> None:
    """A server that sends 1 MiB more than the index asked by a suffix range: the answer is read no further
    than a byte past the index, and the read is EIO whose log line says so."""
    write_sharded_zarr(tmp_path / "a", "zarr-python", keys="v2")
    with RangeServer(tmp_path / "a", suffix_ranges=True).running() as server:
        m = mount(f"zarr3://{server.url}")
        server.extra = 1 << 20
        before = counted(server)
        assert read_errno(m.path / "0.0.0") == errno.EIO
        cold = counted(server) - before
    assert cold == Counter({"GET": 1}), cold
    assert "longer than asked" in m.log_text()


@pytest.mark.parametrize(("etag", "named"), [(True, "If-Match"), (False, "If-Unmodified-Since")])
def test_a_zarr_shard_replaced_after_its_index_is_eio(tmp_path, mount, etag, named) -> None:
    """The version the suffix GET's answer named (its ETag, else its Last-Modified date) is the one every later
    GET asks for: a shard replaced between the read of its index and that of a chunk is EIO, never the new
    object's bytes at the old index's offsets."""
    written = write_sharded_zarr(tmp_path / "a", "zarr-python")
    shard = tmp_path / "a/c/0/0/0"
    with RangeServer(tmp_path / "a", suffix_ranges=True).running() as server:
        server.etag = etag
        m = mount(f"zarr3://{server.url}")
        before = counted(server)
        assert (m.path / "c/0/0/0").read_bytes() == inner_chunk(written, (0, 0, 0))  # the shard's version pinned
        fresh = shard.with_name("new")
        fresh.write_bytes(bytes(b ^ 0xFF for b in shard.read_bytes()[:-ZARR_INDEX]) + shard.read_bytes()[-ZARR_INDEX:])
        when = int(shard.stat().st_mtime) + 10
        os.utime(fresh, (when, when))
        os.replace(fresh, shard)
        assert read_errno(m.path / "c/0/0/1") == errno.EIO
        assert "HEAD" not in counted(server) - before
    assert "changed under the mount" in m.log_text() and named in m.log_text()


def test_a_zarr_shard_without_validators_is_not_kept_on_disk(tmp_path, mount) -> None:
    """A server that names no version (no ETag, no Last-Modified): what the suffix GET and the chunk's GET
    answered is never kept in --cache-dir, where another object of the same size would be taken for it."""
    written = write_sharded_zarr(tmp_path / "a", "zarr-python")
    cache = tmp_path / "cache"
    with RangeServer(tmp_path / "a", suffix_ranges=True).running() as server:
        server.etag = server.last_modified = False
        m = mount(f"zarr3://{server.url}", "--cache-dir", cache)
        before = counted(server)
        assert (m.path / "c/0/0/0").read_bytes() == inner_chunk(written, (0, 0, 0))
        assert counted(server) - before == Counter({"GET": 2})
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_a_shard_the_server_refuses_leaves_its_directories_found_and_its_chunks_failing(tmp_path, mount) -> None:
    """A zarr directory lookup (c/0/0) reads the indexes of the shards below it. When the server refuses them
    (403, not retried), the directory is found and the chunk's read fails with the refusal (EACCES):
    before, the directories were ENOENT, an error dressed as absence. Another shard's chunk reads as ever."""
    written = write_sharded_zarr(tmp_path / "a", "zarr-python")
    with RangeServer(tmp_path / "a", suffix_ranges=True).running() as server:
        server.fail["c/0/0/0"] = server.fail["c/0/0/1"] = [403] * 20  # every shard below c/0/0
        m = mount(f"zarr3://{server.url}")
        assert (m.path / "c" / "0").is_dir() and (m.path / "c" / "0" / "0").is_dir()
        assert read_errno(m.path / "c" / "0" / "0" / "0") == errno.EACCES
        assert (m.path / "c" / "3" / "2" / "2").read_bytes() == inner_chunk(written, (3, 2, 2))  # shard c/1/1/1
        assert "c/0/0/0" in m.log_text()


@pytest.mark.parametrize("encoding", ["gzip", "raw"])
@pytest.mark.parametrize(("minishard_bits", "gets"), [(5, 8), (4, 8 + 32)], ids=["5 a minishard", "10 a minishard"])
def test_a_minishards_chunks_come_with_its_index_in_one_get(tmp_path, mount, minishard_bits, gets, encoding) -> None:
    """tensorstore writes each minishard's chunks right before its index. Once a first minishard has shown the
    directory's minishards to be small (at most 8 chunks), a cold key's read fetches its minishard's index and
    the bytes before it in one GET, checks every entry lies there, and serves the minishard's other keys from
    those bytes: one GET a minishard instead of two in sequence a key. Keys read at random from 8 minishards of
    one shard, 4 each. Minishards of 10 chunks are read as before (an index, then a GET a key): a random read
    there would fetch 10 times what it serves."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=minishard_bits, shard_bits=0, data_encoding=encoding)
    rng = np.random.default_rng(7)
    items = {key: rng.integers(0, 9, 3000, dtype=np.uint8).tobytes() for key in range(1, 160)}
    peers.write_tensorstore_kv(tmp_path / "kv", items, sharding=spec)
    by_minishard: dict[int, list[int]] = {}
    for key in items:
        by_minishard.setdefault(home(spec, key)[1], []).append(key)
    chosen = [keys[:4] for keys in by_minishard.values() if len(keys) >= 4][:9]
    assert len(chosen) == 9, by_minishard
    first, rest = chosen[0], chosen[1:]
    with RangeServer(tmp_path / "kv").running() as server:
        m = mount(server.url)
        assert (m.path / str(first[0])).read_bytes() == items[first[0]]  # the shard index, the index, the key: 3
        before = counted(server)
        wanted = [key for keys in rest for key in keys]
        for key in [wanted[i] for i in rng.permutation(len(wanted))]:
            assert (m.path / str(key)).read_bytes() == items[key], key
        cold = counted(server) - before
    assert cold == Counter({"GET": gets}), cold  # where an index, then a GET a key, cost 8 + 32 before


def test_a_minishard_whose_chunks_lie_elsewhere_is_read_as_it_is_stored(tmp_path, mount) -> None:
    """The spec promises no layout: where the bytes before a minishard index are not its chunks (here the
    shard index of cloud-volume's layout is followed by all the chunks, then the indexes side by side), nothing
    read there is served; each key reads right."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=3, shard_bits=0, data_encoding="raw")
    items = {key: f"value of {key}".encode() * 40 for key in range(1, 200)}
    write_cloudvolume_kv(tmp_path / "kv", spec, items)
    with RangeServer(tmp_path / "kv").running() as server:
        m = mount(server.url)
        for key in items:
            assert (m.path / str(key)).read_bytes() == items[key], key


def test_minishard_indexes_side_by_side_among_empty_minishards_cost_one_get(tmp_path, mount) -> None:
    """A shard whose minishards 1, 4 and 6 hold nothing (their index rows empty, as cloud-volume writes them):
    the five minishard indexes written side by side still come in one GET, the empty rows no gap between them,
    and a key of an empty minishard is absent for no request at all."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=3, shard_bits=1, data_encoding="raw")
    full = (0, 2, 3, 5, 7)
    items = {key: f"value of {key}".encode() * 3 for key in range(1, 400) if home(spec, key)[1] in full}
    write_cloudvolume_kv(tmp_path / "kv", spec, items)
    rows = minishard_rows(tmp_path / "kv" / "0.shard", 3)
    assert [i for i, (start, stop) in enumerate(rows) if start == stop] == [1, 4, 6], rows
    one_each = {}
    for key in items:
        shard, minishard = home(spec, key)
        if shard == 0:
            one_each.setdefault(minishard, key)
    assert sorted(one_each) == list(full)
    empty = next(key for key in range(400) if home(spec, key) == (0, 4))
    with RangeServer(tmp_path / "kv").running() as server:
        m = mount(server.url)
        before = counted(server)
        for key in one_each.values():
            assert (m.path / str(key)).read_bytes() == items[key]
        assert read_errno(m.path / str(empty)) == errno.ENOENT
        cold = counted(server) - before
    assert cold == Counter({"GET": 2 + len(full)}), cold
