"""The sharded key-value layer's listing as `shardfs ls` shows it, with no kernel in between: a mount's
listing is sorted and made unique by name before the kernel sees it, which would hide a layer that lists
a key twice or in the store's order."""

from __future__ import annotations

import functools
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardfs.shards.listing import ListingBudget, Read, in_order
from tests.support import peers
from tests.support.cli import shardfs
from tests.support.datasets import home
from tests.support.http_server import RangeServer
from tests.support.peers import write_cloudvolume_kv

pytestmark = [pytest.mark.loopback]


def ls(source: str | Path, path: str = "") -> list[str]:
    return shardfs("ls", source, path).stdout.splitlines()


def test_keys_list_shard_by_shard_in_the_order_of_their_numbers_from_any_store(tmp_path) -> None:
    """cloud-volume's 16 shards: a local directory lists its files in its own order, a web server cannot
    list them (each is probed by number); the keys come shard by shard, in the order of the shards'
    numbers, and the same from both."""
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=3, shard_bits=4, data_encoding="raw")
    items = {key: f"value of {key}".encode() for key in range(1, 41)}
    root = tmp_path / "kv"
    write_cloudvolume_kv(root, spec, items)
    local = [name for name in ls(root) if name != "info"]
    assert sorted(local, key=int) == sorted(map(str, items), key=int)
    shards = [home(spec, int(name))[0] for name in local]
    assert shards == sorted(shards) and len(set(shards)) > 8, shards
    with RangeServer(root, latency=0).running() as server:
        assert [name for name in ls(server.url) if name != "info"] == local


def test_a_shard_holding_another_shards_keys_lists_only_its_own(tmp_path) -> None:
    """One shard file overwritten with another's bytes (tensorstore's volume): each chunk of the other shards
    is listed once, by where the spec's maths puts it, and none of the overwritten shard's."""
    source = tmp_path / "src"
    peers.write_tensorstore_volume(source, extra_unsharded_scale=False)
    where = peers.volume_chunk_shards(source, "4_4_40")
    kept, lost = sorted(set(where.values()))[:2]
    (source / "4_4_40" / lost).write_bytes((source / "4_4_40" / kept).read_bytes())
    assert sorted(ls(source, "4_4_40")) == sorted(name for name, shard in where.items() if shard != lost)


def test_reads_in_flight_come_back_in_the_order_asked_while_more_are_still_asked() -> None:
    """A listing of more index reads than may be in flight at once, finishing in any order, its budget short
    mid-way: the results come in the order of the reads, those yielded while later reads are still being asked
    as much as those yielded at the end."""
    budget = ListingBudget(left=40)

    def cost(i: int) -> int:
        return 36 if i % 10 == 9 else 4  # one read in ten waits for what the ones before it give back

    def read(i: int) -> int:
        time.sleep(random.random() / 200)
        return i

    with ThreadPoolExecutor(8) as pool:
        reads = (Read(cost(i), functools.partial(read, i), "0.shard") for i in range(100))
        got = []
        for i in in_order(pool, 5, reads, budget):
            got.append(i)
            budget.refund(cost(i))  # its names listed give back
    assert got == list(range(100))
