"""Streamed listings: the kernel asks again from the offset of the first entry that did not fit."""

import stat
from collections.abc import Iterator

from shardfs.fuse.adapter import DirCursor


def entries() -> list[tuple[str, bool]]:
    return [("sub", True), *((f"f{i}", False) for i in range(10))]


def test_modes_tell_files_from_directories() -> None:
    listed = list(DirCursor(lambda: iter(entries())).entries(0))
    assert [(n, m) for n, m, _ in listed[:3]] == [(".", stat.S_IFDIR), ("..", stat.S_IFDIR), ("sub", stat.S_IFDIR)]
    assert all(m == stat.S_IFREG for _, m, _ in listed[3:])
    assert [o for *_, o in listed] == list(range(1, 14))


def test_resumes_at_the_entry_that_did_not_fit() -> None:
    starts = []

    def source() -> Iterator[tuple[str, bool]]:
        starts.append(1)
        return iter(entries())

    cursor = DirCursor(source)
    got, offset = [], 0
    while True:
        batch = []
        for name, _, next_offset in cursor.entries(offset):
            if len(batch) == 4:  # the kernel's buffer is full: this entry is not taken
                break
            batch.append(name)
            offset = next_offset
        if not batch:
            break
        got += batch
    assert got == [".", "..", "sub", *(f"f{i}" for i in range(10))]
    assert len(starts) == 1  # listed once, never restarted from the beginning


def test_seeking_elsewhere_restarts_and_skips() -> None:
    cursor = DirCursor(lambda: iter(entries()))
    assert [n for n, *_ in cursor.entries(5)][:2] == ["f2", "f3"]
    assert [n for n, *_ in cursor.entries(1)][:2] == ["..", "sub"]
