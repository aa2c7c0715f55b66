"""The byte-bounded cache shared by every cache of a mount."""

import itertools
import sys
import threading
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pytest

from shardfs.cache import LARGE_VALUE, ByteCache, entry_cost, large_value_turn
from shardfs.files import BytesFile, Dir
from shardfs.shards.neuroglancer import MinishardIndex
from shardfs.source import open_source
from shardfs.stores.protocol import Owner
from tests.support import peers


def test_bounded_in_bytes_and_least_recently_used_goes_first() -> None:
    table = sys.getsizeof(OrderedDict.fromkeys("abcd"))  # the cache's own table of four entries counts too
    cache = ByteCache(budget=4 * entry_cost("a", bytes(500)) + table + 100)  # four values fit, a fifth does not
    for key in "abcd":
        cache.get_or_make(key, lambda: bytes(500))
    cache.get_or_make("a", lambda: pytest.fail("a was evicted though recently used"))
    cache.get_or_make("e", lambda: bytes(500))  # over budget: b, the least recently used, goes
    made = []
    cache.get_or_make("b", lambda: made.append("b") or bytes(500))
    assert made == ["b"]


def test_one_value_larger_than_the_budget_is_kept_alone() -> None:
    cache = ByteCache(budget=1000)
    huge = cache.get_or_make("huge", lambda: bytes(5000))
    assert cache.get_or_make("huge", lambda: pytest.fail("decoded twice")) is huge
    cache.get_or_make("other", lambda: bytes(5000))  # replaces it in the overflow slot
    made = []
    cache.get_or_make("huge", lambda: made.append(1) or bytes(5000))
    assert made == [1]


def test_each_mount_has_its_own_turn_for_large_values() -> None:
    """Two mounts of one process (two caches): a large value made for one lets go of that mount's file over
    budget only, and waits for no large value of the other's."""
    a, b = ByteCache(budget=1000), ByteCache(budget=1000)
    a.get_or_make("x", lambda: bytes(4000))
    b.get_or_make("y", lambda: bytes(4000))
    with large_value_turn(LARGE_VALUE + 1, a):  # as what decodes for a's mount does (given a's cache)
        assert a.oversized == 0 and b.oversized > 0
        other = threading.Thread(target=lambda: large_value_turn(LARGE_VALUE + 1, b).__enter__())
        other.start()
        other.join(60)
        assert not other.is_alive(), "a large value of one mount waited for another mount's"


def test_concurrent_misses_make_a_value_once() -> None:
    cache, calls, barrier = ByteCache(budget=1 << 20), [], threading.Barrier(8)

    def slow() -> bytes:
        calls.append(1)
        time.sleep(0.2)
        return b"decoded"

    results = []

    def reader() -> None:
        barrier.wait()
        results.append(cache.get_or_make("shard", slow))

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [b"decoded"] * 8 and len(calls) == 1


def test_a_read_of_a_key_being_fetched_with_others_waits_for_that_fetch() -> None:
    """Read-ahead fetches keys lying close in one request (`make_together`): a read of one of them meanwhile
    (`get(wait=True)`, shards/kv.held) waits for that request and takes its bytes, rather than sending its own;
    what is kept or being made already is not fetched again."""
    cache = ByteCache(1 << 20)
    fetching, answered = threading.Event(), threading.Event()

    def fetch(keys: list) -> dict:
        fetching.set()
        answered.wait(10)
        return {key: f"bytes of {key}" for key in keys}

    fetcher = threading.Thread(target=cache.make_together, args=(["a", "b"], fetch))
    fetcher.start()
    assert fetching.wait(10)
    read: list[object] = []
    reader = threading.Thread(target=lambda: read.append(cache.get("b", wait=True)))
    reader.start()
    time.sleep(0.05)
    assert reader.is_alive() and not read  # waiting for the fetch, not answered without it
    answered.set()
    reader.join(10)
    fetcher.join(10)
    assert read == ["bytes of b"]
    assert cache.make_together(["a", "b", "c"], lambda keys: {key: "again" for key in keys}) == ["c"]
    assert cache.get("a") == "bytes of a"


def test_a_failed_make_lets_the_next_thread_try() -> None:
    cache = ByteCache(budget=1 << 20)
    with pytest.raises(ValueError):
        cache.get_or_make("k", lambda: (_ for _ in ()).throw(ValueError("corrupt")))
    assert cache.get_or_make("k", lambda: b"ok") == b"ok"


OWNER = Owner(1000, 1000, 0o444)  # a node's owner is its source file's, shared


def minishard_index(i: int) -> MinishardIndex:
    """A decoded minishard index of four chunks, as a listing leaves thousands of in the cache."""
    rows = np.array([[i << 2, 1, 1, 1], [0, 10 << 30, 0, 0], [512, 300, 301, 302]], "<u8")
    return MinishardIndex.decode(rows.tobytes(), 1 << 20)


@pytest.mark.parametrize(
    "make",
    [
        lambda i: minishard_index(i),
        lambda i: BytesFile(bytes(200) + i.to_bytes(8, "little"), OWNER),  # a chunk decoded at lookup
        lambda i: Dir(OWNER),
        lambda i: i.to_bytes(8, "little") * 20,  # an index read whole
    ],
    ids=["minishard index", "decoded node", "directory", "bytes"],
)
def test_the_budget_bounds_what_many_small_entries_really_cost(make: Callable[[int], object]) -> None:
    """50,000 small entries under path keys, more than a 2 MiB budget holds: what the process allocates for
    the cache (as tracemalloc sees it) is within the budget, and not far below it (the count is measured, not
    guessed: a flat 512 bytes an entry held up to 1.14x the budget of these, and about twice of chunk nodes)."""
    budget = 2 << 20
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = ByteCache(budget)
        for i in range(50_000):
            cache.get_or_make(("node", f"scale/{i}-{i + 8}_0-8_0-8"), lambda i=i: make(i))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.evictions and cache.nbytes <= budget
    assert 0.75 * budget < held <= 1.02 * budget, f"{held / budget:.2f} of the budget"


def test_a_transcoded_block_counts_the_closure_that_makes_it(tmp_path) -> None:
    """`--view n5` of a uint16 gzip volume written by tensorstore transcodes each block (N5 is big-endian): a
    block's node keeps the decoded stored chunk and a closure making the block. Looking up more blocks than a
    1 MiB budget holds, what the process allocates for the cache stays within the budget (with the closure
    uncounted it held 1.6 times the budget)."""
    sharding = peers.sharding_spec(hash="identity", preshift_bits=6, minishard_bits=3, shard_bits=0)
    peers.write_tensorstore_scale(tmp_path, 128, 8, sharding, dtype="uint16")
    budget = 1 << 20
    tree = open_source(str(tmp_path), budget, view="n5").tree
    blocks = [f"s0/{x}/{y}/{z}" for x, y, z in itertools.product(range(16), repeat=3)]
    assert type(tree.lookup(blocks[0])).__name__ == "LazyFile"  # a block made when read, not a stored chunk
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for path in blocks:
            tree.lookup(path)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert tree.cache.evictions and tree.cache.nbytes <= budget
    assert held <= 1.02 * budget, f"{held / budget:.2f} of the budget"
