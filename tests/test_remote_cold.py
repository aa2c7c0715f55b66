"""Cold reads of a remote source cost few round trips: a shard is opened by the GET of its shard index (the
answer names its size and version: no HEAD first), a shard's minishard indexes written next to each other
come in one GET, and a listing keeps many index requests in flight. Counted on the loopback server, whose
datasets are written by tensorstore and cloud-volume."""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections import Counter
from pathlib import Path

import mmh3
import pytest
from cloudvolume.datasource.precomputed.sharding import ShardingSpecification, synthesize_shard_files

from shardfs.shards.neuroglancer import LISTING_BUDGET
from tests import peers
from tests.http_server import RangeServer
from tests.test_remote_http import chunk_names

BUCKET = "bkt"
SCALE = "4_4_40"


def counted(server: RangeServer) -> Counter[str]:
    """Requests so far, by method."""
    after: Counter[str] = Counter()
    with server.lock:
        for (method, _), n in server.requests.items():
            after[method] += n
    return after


def home(spec: dict, key: int) -> tuple[int, int]:
    """(shard, minishard) of a key, by the spec's maths written out here, owing nothing to shardfs."""
    hashed = mmh3.hash64((key >> spec["preshift_bits"]).to_bytes(8, "little"), 0, False, False)[0]
    return (hashed >> spec["minishard_bits"]) & ((1 << spec["shard_bits"]) - 1), hashed & (
        (1 << spec["minishard_bits"]) - 1
    )


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


def write_cloudvolume_kv(root: Path, spec: dict, items: dict[int, bytes]) -> None:
    """Shards as cloud-volume (and igneous) write them: chunk data first, then every minishard index, one
    after the other; plus an `info` of just `{"sharding": spec}`."""
    root.mkdir(parents=True)
    for name, blob in synthesize_shard_files(ShardingSpecification.from_dict(spec), items).items():
        (root / name).write_bytes(blob)
    (root / "info").write_text(json.dumps({"sharding": spec}))


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
