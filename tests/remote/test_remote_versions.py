"""A remote object replaced or deleted under the mount, on a loopback web server that names versions as real
ones do (ETag, Last-Modified only, or neither) and honours or ignores preconditions: a read through the
kernel is the version its index came from, or EIO whose log line says what changed; never other bytes,
never ENOENT."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from tests.support import peers
from tests.support.datasets import replace
from tests.support.http_server import RangeServer
from tests.support.reading import chunk_names, forget_pages, read_errno

pytestmark = [pytest.mark.kernel, pytest.mark.loopback]


SCALE = "4_4_40"


@pytest.fixture
def volume(raw_volume, tmp_path) -> tuple[Path, Path]:
    """A copy of the volume this test may rewrite, and the twin."""
    source = tmp_path / "src"
    shutil.copytree(raw_volume[0], source)
    return source, raw_volume[1]


def first_chunk(source: Path, twin: Path) -> tuple[str, Path]:
    """A chunk's name and its shard."""
    name = chunk_names(twin, SCALE)[0]
    return name, source / SCALE / peers.volume_chunk_shards(source, SCALE)[name]


@pytest.mark.parametrize(
    ("etag", "last_modified", "preconditions", "grow", "named"),
    [
        (True, True, True, False, "the server refused If-Match"),  # 412
        (True, True, False, False, "ETag"),  # ignored: the answer's ETag differs
        ("weak", True, True, False, "ETag W/"),  # If-Match is not sent: it never matches a weak ETag
        (False, True, True, False, "the server refused If-Unmodified-Since"),  # 412
        (False, True, False, False, "Last-Modified"),  # ignored: the answer's date differs
        (False, False, True, True, "size"),  # nothing but the size names a version
    ],
    ids=["etag", "etag-ignored", "weak-etag", "last-modified", "last-modified-ignored", "size-only"],
)
def test_an_object_replaced_under_the_mount_is_eio(volume, mount, etag, last_modified, preconditions, grow, named):
    source, twin = volume
    name, shard = first_chunk(source, twin)
    with RangeServer(source).running() as server:
        server.etag, server.last_modified, server.preconditions = bool(etag), last_modified, preconditions
        server.weak_etags = etag == "weak"
        m = mount(server.url)
        chunk = m.path / SCALE / name
        assert chunk.read_bytes() == (twin / SCALE / name).read_bytes()  # its shard opened, its indexes read
        replace(shard, twin / SCALE / name, grow)
        forget_pages(chunk)
        assert read_errno(chunk) == errno.EIO
    log = m.log_text()
    assert "changed under the mount" in log and named in log, log


def test_an_object_deleted_under_the_mount_is_eio_never_enoent(volume, mount) -> None:
    """Deleted after it was opened: a read through an index already read, and one that still needs an index,
    are both EIO saying so; the object is not absent to the mount, which has seen it."""
    source, twin = volume
    name, shard = first_chunk(source, twin)
    others = [
        n for n in chunk_names(twin, SCALE) if source / SCALE / peers.volume_chunk_shards(source, SCALE)[n] == shard
    ]
    with RangeServer(source).running() as server:
        m = mount(server.url)
        assert (m.path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes()
        shard.unlink()
        forget_pages(m.path / SCALE / name)
        assert [read_errno(m.path / SCALE / n) for n in others] == [errno.EIO] * len(others)
    errors = [line for line in m.log_text().splitlines() if "level=error" in line]
    assert errors and all("deleted since it was opened" in line for line in errors), errors


def test_a_source_without_versions_is_never_kept_on_disk(volume, mount, tmp_path) -> None:
    """No ETag, no Last-Modified: an object's version is only its size, so --cache-dir would answer a
    same-size replacement with the old bytes. Nothing is kept there, and the log says so once."""
    source, twin = volume
    cache = tmp_path / "cache"
    with RangeServer(source).running() as server:
        server.etag = server.last_modified = False
        m = mount(server.url, "--cache-dir", cache)
        for name in chunk_names(twin, SCALE):
            assert (m.path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes()
    assert not [p for p in cache.rglob("*") if p.is_file()]
    warnings = [line for line in m.log_text().splitlines() if "event=unversioned" in line]
    assert len(warnings) == 1 and "level=warning" in warnings[0] and server.url in warnings[0], warnings
