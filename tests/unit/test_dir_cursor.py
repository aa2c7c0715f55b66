"""Directory offsets are cookies naming a position: an entry's number in the directory's listing, sorted by
name. Resuming anywhere is an index into the listing, a daemon that never saw the handle resumes it the same
way, and a handle holds nothing. Listings are made by a few workers that take the users in turn."""

from __future__ import annotations

import os
import stat
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfs.fs.bridge import Bridge
from shardfs.fuse import wire
from shardfs.fuse.listing import Listing, ListingWorkers
from shardfs.request import Request
from shardfs.source import open_source
from tests.support import peers


def entries() -> list[tuple[str, bool]]:
    return [("sub", True), *((f"f{i}", False) for i in range(10)), ("f3", False)]


def ino(name: str) -> int:
    return 1000 + len(name)


def dirents(page: bytes) -> list[tuple[int, int, str, int]]:
    """(ino, next offset, name, d_type) of each fuse_dirent in a page, as the kernel reads them."""
    found, at = [], 0
    while at < len(page):
        number, offset, namelen, kind = wire.DIRENT.unpack_from(page, at)
        name = page[at + wire.DIRENT.size : at + wire.DIRENT.size + namelen].decode()
        found.append((number, offset, name, kind))
        at += wire.DIRENT.size + namelen + (-(wire.DIRENT.size + namelen) % 8)
    return found


def test_a_listing_is_sorted_deduplicated_and_paged_from_any_offset() -> None:
    listing = Listing.of(iter(entries()), "/d", ino)
    names = [".", "..", *sorted(f"f{i}" for i in range(10)), "sub"]
    whole = dirents(listing.page(0, 1 << 20))
    assert [n for _, _, n, _ in whole] == names and len(listing) == len(names)
    assert [o for _, o, _, _ in whole] == list(range(1, len(names) + 1))  # each d_off: the next entry's number
    assert [k for *_, k in whole] == [4, 4, *[8] * 10, 4]  # DT_DIR, DT_REG
    assert [i for i, *_ in whole][2:] == [ino(n) for n in names[2:]]
    for offset in range(len(names) + 1):
        for size in (24, 40, 100, 1 << 20):  # a page holds what fits, never a piece of an entry
            page = dirents(listing.page(offset, size))
            assert page == whole[offset : offset + len(page)] and sum(32 for _ in page) <= size
            assert page or offset == len(names) or size < 40
    assert listing.complete and Listing.of(reversed(entries()), "/d", ino) == listing  # the same set, the same offsets


def test_a_listing_sorted_in_runs_is_the_listing_sorted_at_once(monkeypatch) -> None:
    """Names are sorted RUN at a time while gathered and merged: runs of 3 give what one run gives, in order,
    each name once, a file where a name is both a file and a directory."""
    many = [(f"n{i * 37 % 101}", i % 7 == 0) for i in range(202)]  # each name twice, some once as a directory
    many += [("sub", True), ("sub", True)]
    whole = Listing.of(many, "/d", ino)
    files = {name for name, is_dir in many if not is_dir}
    expected = [(b".", True), (b"..", True), *((n.encode(), n not in files) for n in sorted({n for n, _ in many}))]
    assert [whole.entry(i) for i in range(len(whole))] == expected and any(d for _, d in expected[2:])
    monkeypatch.setattr("shardfs.fuse.listing.RUN", 3)
    assert Listing.of(many, "/d", ino) == whole


def test_a_listing_past_its_bound_keeps_what_it_has_and_says_so(monkeypatch, caplog) -> None:
    monkeypatch.setattr("shardfs.fuse.listing.LISTED_NAMES", 5)

    def endless() -> Iterator[tuple[str, bool]]:
        n = 0
        while True:
            n += 1
            yield f"n{n}", False

    listing = Listing.of(endless(), "/endless", ino)
    assert len(listing) == 2 + 5 and not listing.complete
    assert [r.event for r in caplog.records] == ["listing_bound"]  # type: ignore[attr-defined]
    assert "/endless" in caplog.text


@pytest.mark.parametrize("past", [-1, 0, 1], ids=["one below", "at the bound", "one above"])
@pytest.mark.parametrize("bound", ["LISTED_NAMES", "LISTED_BYTES"])
def test_each_listing_bound_holds_at_its_value_and_cuts_one_past_it(monkeypatch, caplog, bound, past) -> None:
    """Six names of 8 bytes against a bound of 6 names or 48 bytes of names: a directory one name (one byte) below
    it and one at it list whole, saying nothing; one a name (a byte) past it lists up to the bound, and says so."""
    monkeypatch.setattr(f"shardfs.fuse.listing.{bound}", 6 if bound == "LISTED_NAMES" else 6 * 8)
    if bound == "LISTED_NAMES":
        names = [f"name-{i:03d}" for i in range(6 + past)]
    else:
        names = [f"name-{i:03d}" for i in range(5)] + ["n" * (8 + past)]
    listing = Listing.of(((name, False) for name in names), "/d", ino)
    shown = [listing.entry(i)[0].decode() for i in range(2, len(listing))]
    assert listing.complete is (past <= 0) and len(caplog.records) == (past > 0), caplog.text
    assert shown == sorted(names[: 6 if bound == "LISTED_NAMES" else 5 + (past <= 0)])


def test_a_listing_costs_the_memory_it_holds() -> None:
    """What a listing counts against the cache's budget is what it holds as allocated (a grown buffer keeps room
    spare, an entry's start takes 4 bytes), not its length in entries or bytes."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        listing = Listing.of(((f"name-{i}", False) for i in range(20_000)), "/d", ino)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held * 0.95 <= listing.nbytes <= held * 1.05, (listing.nbytes, held)


def test_names_that_are_not_utf8_come_back_as_they_were() -> None:
    name = os.fsdecode(b"caf\xe9")
    listing = Listing.of([(name, False), (".", True), ("..", True)], "/d", ino)
    assert [listing.entry(i) for i in range(len(listing))] == [(b".", True), (b"..", True), (b"caf\xe9", False)]


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded directory of 300 keys beside a plain directory of 300 files passed through."""
    root = tmp_path_factory.mktemp("kv")
    peers.write_tensorstore_kv(root, {k: bytes([k % 256]) * 3 for k in range(300)})
    (root / "notes").mkdir()
    for i in range(300):
        (root / "notes" / f"note-{i:03d}").write_text(str(i))
    return root


def listing(bridge: Bridge, directory: str) -> Listing:
    """The listing of directory ('' the root), looked up by name as the kernel does."""
    entry = bridge.lookup(Request(), wire.ROOT_ID, directory.encode()) if directory else None
    return bridge.listing(Request(), wire.ROOT_ID if entry is None else entry[0])


@pytest.mark.parametrize("directory", ["", "notes"])
def test_a_fresh_daemon_resumes_any_offset_the_same_way(kv, directory) -> None:
    """Two bridges over the same source, as two daemons one after the other: every offset the first gave
    names the same entry in the second, which never saw the listing before, and the tail from any offset
    is the first's."""
    first = dirents(listing(Bridge(open_source(str(kv), 8 << 20).tree, 0), directory).page(0, 1 << 30))
    assert len(first) > 300 and [o for _, o, _, _ in first] == list(range(1, len(first) + 1))
    files = {n for _, _, n, kind in first if kind == stat.S_IFREG >> 12}
    assert files >= ({f"note-{i:03d}" for i in range(300)} if directory else {"0", "299", "info"})
    for offset in (0, 1, 2, 150, len(first) - 1, len(first)):
        fresh = Bridge(open_source(str(kv), 8 << 20).tree, 0)
        assert dirents(listing(fresh, directory).page(offset, 1 << 30)) == first[offset:], offset


def test_resuming_lists_the_directory_once(kv) -> None:
    """Offsets in any order, far ones first: the tree lists the directory once, into the listing."""
    ops = Bridge(open_source(str(kv), 8 << 20).tree, 0)
    made = []
    listdir = ops.tree.listdir

    def counted(path: str) -> Iterator[tuple[str, bool]]:
        made.append(path)
        return listdir(path)

    ops.tree.listdir = counted  # type: ignore[method-assign]
    whole = dirents(ops.listing(Request(), wire.ROOT_ID).page(0, 1 << 30))
    for offset in (250, 3, 299, 100, 0):
        assert dirents(ops.listing(Request(), wire.ROOT_ID).page(offset, 32)) == whole[offset : offset + 1]  # one entry
    assert made == [""]


def test_workers_take_users_in_turn_and_never_all_for_one() -> None:
    """User 1 queues many slow listings, then user 2 one: user 2's runs while user 1's still wait, and user
    1 never has every worker."""
    workers = ListingWorkers(workers=3)
    release = threading.Event()
    running: dict[int, int] = {1: 0, 2: 0}
    most = {1: 0, 2: 0}
    lock = threading.Lock()
    done = threading.Event()

    def job(uid: int) -> None:
        with lock:
            running[uid] += 1
            most[uid] = max(most[uid], running[uid])
        if uid == 2:
            done.set()
        else:
            release.wait(30)
        with lock:
            running[uid] -= 1

    for _ in range(10):
        workers.submit(1, lambda: job(1))
    workers.submit(2, lambda: job(2))
    assert done.wait(30), "user 2's listing waited behind user 1's"
    assert most[1] == 2  # all workers but one
    release.set()
