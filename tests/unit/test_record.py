"""A connection's record (shardfs/fuse/record.py): what the next daemon reads back is what the last one wrote,
the node table's ids survive into a new table, and a journal of mostly dropped ids is rewritten small."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from shardfs import collection
from shardfs.fs.nodes import PACKED, Nodes
from shardfs.fuse import record as record_module
from shardfs.fuse import wire
from shardfs.fuse.filesystem import StaleNode
from shardfs.fuse.record import (
    COMPACT_AFTER,
    SPAN_AT,
    TERMS_AT,
    TERMS_LENGTH_AT,
    Connection,
    Record,
    RecordError,
    Terms,
)
from shardfs.service import handover
from shardfs.source import open_source
from shardfs.tree import Located
from tests.support import peers


class Unnumbered:
    """Keys that number nothing: every path gets a table id."""

    numbers = 0

    def numbering(self, numbered: list[str], journal: Callable[[str], None]) -> None:
        pass

    def locate(self, path: str) -> Located:
        return Located(path, None)

    def child(self, parent: Located, name: str) -> Located:
        return Located(f"{parent.path}/{name}".lstrip("/"), None)

    def path_of(self, number: int, key: int) -> str | None:
        return None


def reopened(record: Record) -> Record:
    """The record as the next daemon gets it: another descriptor of the same memfd."""
    return Record(os.dup(record.fd))


def test_terms_and_table_read_back_by_the_next_daemon() -> None:
    record = Record.new()
    assert record.terms() is None and reopened(record).terms() is None  # INIT not answered yet
    terms = Terms(38, 0x4C0001, 131072, 4096, 256, 1, True, True)
    record.settle(terms)
    record.added(2, "a")
    record.added(3, "a/ünï code\nname")
    record.added(4, "b")
    record.dropped(2, "a", {"a/ünï code\nname": 3, "b": 4})
    after = reopened(record)
    assert after.terms() == terms
    assert after.table() == {3: "a/ünï code\nname", 4: "b"}
    after.added(5, "c")  # the next daemon goes on journalling where the last one stopped
    assert reopened(record).table() == {3: "a/ünï code\nname", 4: "b", 5: "c"}


def test_table_ids_survive_into_the_next_daemons_table() -> None:
    record = Record.new()
    nodes = Nodes(Unnumbered(), record)
    ids = {path: nodes.looked_up(Located(path, None)) for path in ("s0", "s0/info", "s1")}
    nodes.forget(ids["s1"], 1)  # dropped: the kernel holds it no more
    restored = Nodes(Unnumbered(), reopened(record))
    assert restored.located(ids["s0"]).path == "s0" and restored.located(ids["s0/info"]).path == "s0/info"
    with pytest.raises(StaleNode):
        restored.located(ids["s1"])
    fresh = restored.looked_up(Located("s2", None))
    assert fresh not in ids.values() and not fresh & PACKED  # never an id the kernel may still hold
    assert restored.looked_up(Located("s0", None)) == ids["s0"]  # the same path, the same id
    restored.forget(ids["s0"], 1)  # its count from before is unknown: kept, not dropped
    assert restored.located(ids["s0"]).path == "s0"
    restored.forget(123456, 7)  # an id never issued: harmless
    assert restored.located(wire.ROOT_ID).path == ""


def test_a_journal_of_dropped_ids_is_rewritten_and_its_pages_given_back() -> None:
    record = Record.new()
    nodes = Nodes(Unnumbered(), record)
    name = "d" * 200
    kept = nodes.looked_up(Located("kept", None))
    for i in range(2 * COMPACT_AFTER // 200):
        nodes.forget(nodes.looked_up(Located(f"{name}{i}", None)), 1)
    assert reopened(record).table() == {kept: "kept"}
    assert os.fstat(record.fd).st_blocks * 512 < COMPACT_AFTER  # the old journal's pages were punched out


def test_what_is_not_a_kept_connection_is_refused() -> None:
    memfd = os.memfd_create("not-a-record")
    os.write(memfd, b"something else entirely, long enough for a header")
    with pytest.raises(RecordError, match="not a shardfs record"):
        Record(memfd)
    with pytest.raises(RecordError, match="not /dev/fuse"):
        Connection.of([memfd, Record.new().fd])
    with pytest.raises(RecordError, match="2 descriptors"):
        Connection.of([memfd])


@pytest.mark.kernel
def test_a_kept_descriptor_whose_mount_has_ended_is_not_taken_up() -> None:
    """A /dev/fuse descriptor of no live connection (here: never mounted; or unmounted while no daemon ran)
    is refused, its descriptors closed: the daemon then mounts afresh."""
    fuse = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    record = Record.new()
    store = handover.SystemdStore("@unused", handover.served("/data", "native", Path("/mnt")))
    assert handover._taken_up([fuse, record.fd], "the test", store) is None
    with pytest.raises(OSError):
        os.fstat(fuse)


@pytest.mark.parametrize(
    ("span", "terms"), [((8192, 4096), 0), ((4096, 1 << 62), 0), ((0, 4096), 0), ((4096, 4096), 1 << 30)]
)
def test_a_record_with_an_absurd_span_or_length_is_refused_not_read(span: tuple[int, int], terms: int) -> None:
    """A record's header is bytes another daemon wrote: a journal span past the record, or a length past its
    room, is refused (the daemon then mounts afresh), never read as a count of bytes to allocate."""
    record = Record.new()
    if terms:
        os.pwrite(record.fd, struct.pack("=I", terms), TERMS_LENGTH_AT)
    os.pwrite(record.fd, struct.pack("=QQ", *span), SPAN_AT)
    with pytest.raises(RecordError, match=r"span|past their room"):
        Record(record.fd).terms()


def test_what_a_connection_serves_is_stamped_and_read_back() -> None:
    record = Record.new()
    assert record.serves() is None  # as in a record of a version before stamping: taken up as it was
    served = handover.served("s3://b/vol", "n5", Path("/mnt/x"))
    record.stamp(served)
    assert Record(record.fd).serves() == served
    assert json.loads(served) == {"source": "s3://b/vol", "view": "n5", "mountpoint": "/mnt/x"}


def test_no_id_is_issued_again_by_a_second_or_third_daemon() -> None:
    """Each daemon issues ids, then the kernel forgets them highest first, so that the journal is rewritten
    small while the highest id issued is already dropped: the next daemon, and the one after it, must still
    issue only ids that no daemon before issued (the kernel may hold any of them yet, in a dentry it revalidates)."""
    record = Record.new()
    issued: set[int] = set()
    name = "d" * 200
    for daemon in range(3):
        nodes = Nodes(Unnumbered(), reopened(record))
        fresh = [nodes.looked_up(Located(f"{daemon}/{name}{i}", None)) for i in range(2 * COMPACT_AFTER // 200)]
        assert not issued & set(fresh), f"daemon {daemon + 1} issued ids issued before"
        issued |= set(fresh)
        for nodeid in reversed(fresh[1:]):
            nodes.forget(nodeid, 1)
        assert os.fstat(record.fd).st_blocks * 512 < COMPACT_AFTER  # rewritten: the old journal was let go


def _reads(fd: int) -> tuple[Terms | None, str | None, dict[int, str], list[str]]:
    """What a next daemon reads of the record at fd."""
    record = Record(fd)
    return record.terms(), record.serves(), record.table(), record.numbered


def test_a_record_cut_at_any_point_of_any_write_reads_as_before_or_after(monkeypatch) -> None:
    """A daemon killed in the middle of a change leaves the record as its writes up to some point: each write cut
    at each byte (a header field whole or not at all: one pwrite of a few bytes within a page, which a kill does
    not split) must read back as the record before the change or after it, never as terms, a stamp or a table
    entry that was never written. The changes: INIT's terms, the stamp, ids added and dropped, directories
    numbered, the journal rewritten (made to happen early here) and the entries after it."""
    monkeypatch.setattr(record_module, "COMPACT_AFTER", 256)
    record = Record.new()
    cuts: list[int] = []
    write = os.pwrite

    def cut_pwrite(fd: int, data: bytes, offset: int) -> int:
        if fd == record.fd:
            for n in range(len(data)) if offset >= TERMS_AT else [0]:
                image = bytearray(os.pread(fd, max(os.fstat(fd).st_size, offset + n), 0))
                image[offset : offset + n] = data[:n]
                copy = os.memfd_create("cut")
                write(copy, bytes(image), 0)
                cuts.append(copy)
        return write(fd, data, offset)

    nodes = Nodes(Unnumbered(), record)
    changes = [
        lambda: record.settle(Terms(40, 0x4C0001, 131072, 4096, 256, 1, True, True)),
        lambda: record.stamp(handover.served("/data", "n5", Path("/mnt"))),
        *(lambda i=i: nodes.looked_up(Located(f"dir/{i}", None)) for i in range(12)),
        *(lambda i=i: record.number(f"numbered/{i}") for i in range(2)),
        *(lambda i=i: nodes.forget(i, 1) for i in range(13, 3, -1)),  # a rewrite on the way
        lambda: nodes.looked_up(Located("after the rewrite", None)),
        lambda: record.number("numbered after the rewrite"),
    ]
    rewritten = False
    for change in changes:
        before = _reads(record.fd)
        start = struct.unpack("=Q", os.pread(record.fd, 8, SPAN_AT))[0]
        monkeypatch.setattr(os, "pwrite", cut_pwrite)
        change()
        monkeypatch.setattr(os, "pwrite", write)
        after = _reads(record.fd)
        rewritten |= struct.unpack("=Q", os.pread(record.fd, 8, SPAN_AT))[0] != start
        assert before != after
        for copy in cuts:
            assert _reads(copy) in (before, after)
            os.close(copy)
        cuts.clear()
    assert rewritten
    assert _reads(record.fd)[3] == ["numbered/0", "numbered/1", "numbered after the rewrite"]  # kept by the rewrite


def test_a_directory_of_datasets_numbers_its_sharded_directories_for_the_mounts_life_and_the_next_daemons(
    tmp_path, monkeypatch
) -> None:  # fmt: skip
    """Three sharded datasets below a directory, one open at a time: a chunk's id packs the number its
    directory got when a chunk of it was first named; its dataset let go and opened again, the same number; the
    next daemon, given the record, reads an id as the same file, and numbers a directory new to it past them."""
    monkeypatch.setattr(collection, "OPEN", 1)  # opening a dataset lets go of the one open
    spec = peers.sharding_spec(preshift_bits=0, minishard_bits=1, shard_bits=0, data_encoding="raw")
    for name in "abc":
        peers.write_tensorstore_kv(tmp_path / name, {key: f"{name}{key}".encode() for key in (1, 2)}, sharding=spec)

    def chunk(keys: collection.Collection, nodes: Nodes, name: str) -> int:
        directory, key = name.split("/")
        return nodes.looked_up(keys.child(Located(directory, None), key))

    record = Record.new()
    first = open_source(tmp_path, 1 << 20).tree
    assert isinstance(first, collection.Collection)
    nodes = Nodes(first, record)
    ids = {name: chunk(first, nodes, name) for name in ("b/1", "a/2", "b/2")}
    assert chunk(first, nodes, "a/1") == ids["a/2"] - 1  # a let go and opened again: its number as it was
    assert all(nodeid & PACKED for nodeid in ids.values()) and len(nodes) == 1  # the root alone in the table
    then = open_source(tmp_path, 1 << 20).tree
    after = Nodes(then, reopened(record))
    new = chunk(then, after, "c/1")
    shift = 63 - collection.NUMBER_BITS  # the number's bits, above the key's
    assert new & PACKED and new >> shift not in {nodeid >> shift for nodeid in ids.values()}
    for name, nodeid in ids.items():
        assert then.node(after.place(nodeid)).read(0, 10) == name.replace("/", "").encode(), name
        assert after.located(nodeid).path == name
