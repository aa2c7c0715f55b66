"""The byte-bounded cache shared by every cache of a mount."""

import threading
import time

import pytest

from shardfs.cache import ENTRY_OVERHEAD, ByteCache


def test_bounded_in_bytes_and_least_recently_used_goes_first() -> None:
    cache = ByteCache(budget=4 * (500 + ENTRY_OVERHEAD) + 100)  # four values fit, a fifth does not
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


def test_a_failed_make_lets_the_next_thread_try() -> None:
    cache = ByteCache(budget=1 << 20)
    with pytest.raises(ValueError):
        cache.get_or_make("k", lambda: (_ for _ in ()).throw(ValueError("corrupt")))
    assert cache.get_or_make("k", lambda: b"ok") == b"ok"
