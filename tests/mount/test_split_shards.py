"""The earlier precomputed sharded layout: each shard stored as `<n>.index` (its shard index, 16·2^minishard_bits
bytes) and `<n>.data` (the rest), whose concatenation is today's `<n>.shard`. Shards written by tensorstore and
cloud-volume are split here as the spec says, mounted, and read back through the kernel by the same peers: they
must see what the `.shard` source and the unsharded twin hold, locally and over HTTP. A pair with a half missing,
or split at the wrong place, is EIO for its keys alone, with a log line naming the file, and `shardfs check`
names it."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from cloudvolume import CloudVolume
from cloudvolume.datasource.precomputed.annotation import PrecomputedAnnotationSource

from tests.support import peers
from tests.support.cli import shardfs
from tests.support.datasets import replace
from tests.support.http_server import RangeServer
from tests.support.reading import assert_eio, denied, files_under, forget_pages, read_errno, read_ts
from tests.support.users import as_user

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback]


SCALE = "4_4_40"
VOLUME_MINISHARD_BITS = peers.sharding_spec()["minishard_bits"]


def split(directory: Path, minishard_bits: int) -> list[str]:
    """Every `<n>.shard` in directory replaced by `<n>.index` (its first 16·2^minishard_bits bytes) and
    `<n>.data` (the rest); the stems split, sorted."""
    stems = []
    for shard in sorted(directory.glob("*.shard")):
        blob = shard.read_bytes()
        cut = 16 << minishard_bits
        assert len(blob) > cut
        shard.with_suffix(".index").write_bytes(blob[:cut])
        shard.with_suffix(".data").write_bytes(blob[cut:])
        shard.unlink()
        stems.append(shard.stem)
    return stems


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, np.ndarray]:
    """(the `.shard` source, its split copy, the unsharded twin, the volume as tensorstore reads the source).
    Raw chunk data, so that a chunk is read straight from its range of the `.data`."""
    root = tmp_path_factory.mktemp("split")
    source, split_source, twin = root / "src", root / "split", root / "twin"
    expected = peers.write_tensorstore_volume(source, data_encoding="raw", unsharded_twin=twin)
    shutil.copytree(source, split_source)
    assert len(split(split_source / SCALE, VOLUME_MINISHARD_BITS)) == 4
    return source, split_source, twin, expected


def assert_volume_as_twin(m: Path, twin: Path, expected: np.ndarray) -> None:
    """The mount shows the unsharded twin's chunk files, byte for byte, and the peers read the volume."""
    got, want = files_under(m / SCALE), files_under(twin / SCALE)
    assert got.keys() == want.keys() and len(got) > 10
    assert got == want
    assert np.array_equal(read_ts(m), expected)
    cv = CloudVolume(f"file://{m}", mip=0, fill_missing=True, progress=False)
    assert np.array_equal(np.asarray(cv[cv.bounds]), expected)


def chunks_in(source: Path, stem: str) -> list[str]:
    """The chunk names a shard holds, by the spec's maths (peers.volume_chunk_shards)."""
    where = peers.volume_chunk_shards(source, SCALE)
    return sorted(name for name, shard in where.items() if shard == f"{stem}.shard")


# ---------------------------------------------------------------------------------------------------------------------
# Sound pairs: read as their `.shard` would be


def test_volume_read_back_by_the_peers(volume, mount) -> None:
    source, split_source, twin, expected = volume
    assert np.array_equal(read_ts(source), expected)
    m = mount(split_source)
    assert_volume_as_twin(m.path, twin, expected)
    assert not {p.suffix for p in (m.path / SCALE).iterdir()} & {".index", ".data", ".shard"}  # halves hidden
    assert files_under(m.path / "8_8_40") == files_under(source / "8_8_40")


def test_a_shard_stored_both_ways_is_listed_once(volume, tmp_path, mount) -> None:
    """A `.shard` beside a pair of the same shard is read, and its keys are listed once; a directory mixing the
    layouts shows every chunk."""
    source, split_source, twin, expected = volume
    mixed = tmp_path / "mixed"
    shutil.copytree(split_source, mixed)
    for stem in ("0", "1"):
        shutil.copy(source / SCALE / f"{stem}.shard", mixed / SCALE)
    (mixed / SCALE / "1.index").unlink()
    (mixed / SCALE / "1.data").unlink()  # shard 1 as `.shard` alone, 0 both ways, 2 and 3 as pairs
    m = mount(mixed)
    listed = os.listdir(m.path / SCALE)
    assert len(listed) == len(set(listed))
    assert_volume_as_twin(m.path, twin, expected)


def test_skeletons_meshes_and_annotations(tmp_path, mount) -> None:
    skel, mesh, ann = tmp_path / "skel", tmp_path / "mesh", tmp_path / "ann"
    skeletons = peers.write_cloudvolume_skeletons(skel)
    meshes = peers.write_cloudvolume_multires_meshes(mesh, data_encoding="gzip")
    annotations = peers.write_tensorstore_annotations(ann)
    want_skeletons = {segid: CloudVolume(f"file://{skel}", progress=False).skeleton.get(segid) for segid in skeletons}
    want_annotations = PrecomputedAnnotationSource(f"file://{ann}").get_by_relationship("segment", 77).ids
    for directory in (skel / "skeletons", mesh / "mesh"):
        assert split(directory, json.loads((directory / "info").read_text())["sharding"]["minishard_bits"])
    info = json.loads((ann / "info").read_text())
    for part in (info["by_id"], *info["relationships"], *info["spatial"]):
        assert split(ann / part["key"], part["sharding"]["minishard_bits"])

    m = mount(skel)
    assert sorted(os.listdir(m.path / "skeletons")) == sorted([*map(str, skeletons), "info"])
    mounted = CloudVolume(f"file://{m.path}", progress=False)
    for segid, blob in skeletons.items():
        assert (m.path / "skeletons" / str(segid)).read_bytes() == blob
        got, want = mounted.skeleton.get(segid), want_skeletons[segid]
        assert np.array_equal(got.vertices, want.vertices) and np.array_equal(got.edges, want.edges)

    m = mount(mesh)
    assert set(os.listdir(m.path / "mesh")) == {*meshes, "info"}
    for name, blob in meshes.items():  # the fragments are stored just before each manifest, in the `.data`
        assert (m.path / "mesh" / name).read_bytes() == blob, name
    mounted = CloudVolume(f"file://{m.path}", progress=False)
    for segid in peers.MESH_IDS:
        got = np.asarray(mounted.mesh.get(segid, lod=0)[segid].vertices, np.float64)
        want = peers.mesh_expected_vertices(segid, 0)
        assert np.allclose(np.unique(got.round(3), axis=0), np.unique(want.round(3), axis=0), atol=1e-3)

    a = mount(ann)

    assert files_under(a.path).keys() - {"info"} == annotations.keys()
    assert all((a.path / rel).read_bytes() == blob for rel, blob in annotations.items())
    assert sorted(PrecomputedAnnotationSource(f"file://{a.path}").get_by_relationship("segment", 77).ids) == sorted(
        want_annotations
    )


@pytest.mark.parametrize("scheme", ["http", "gs"])
def test_remote(volume, tmp_path, mount, monkeypatch, scheme) -> None:
    """Over HTTP, which cannot list, each shard is probed by its `.shard`, then by its `.index`; from a bucket
    (the loopback server standing in for GCS), the halves are listed. A `.shard` is asked for at most once (a
    GET of its shard index, or a HEAD while listing, answered 404), and its absence remembered."""
    _, split_source, twin, expected = volume
    root = tmp_path / "root"
    shutil.copytree(split_source, root / "bkt" / "vol" if scheme == "gs" else root)
    for name in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    with RangeServer(root).running() as server:
        where = ("gs://bkt/vol", "--endpoint", server.url) if scheme == "gs" else (f"precomputed://{server.url}",)
        m = mount(*where)
        assert sorted(os.listdir(m.path / SCALE)) == sorted(os.listdir(twin / SCALE))
        assert_volume_as_twin(m.path, twin, expected)
        pairs = len(list(split_source.glob(f"{SCALE}/*.index")))
        shards = sum(n for (_, path), n in server.requests.items() if path.endswith(".shard"))
        assert server.gets(".data") and server.gets(".index") and shards <= pairs


@pytest.mark.parametrize("half", ["data", "index"])
def test_either_half_replaced_under_the_mount_is_eio(volume, tmp_path, mount, half) -> None:
    """Both halves' versions are pinned: once a shard's indexes are read, a half replaced on the server (a new
    ETag) makes the reads that reach it EIO, its log line naming that half; no other bytes are ever served.
    A small `.index` is read whole when its shard is opened, so no read reaches it again: its replacement
    changes nothing the mount serves."""
    source, split_source, twin, _ = volume
    copy = tmp_path / "src"
    shutil.copytree(split_source, copy)
    name, *others = chunks_in(source, "0")
    with RangeServer(copy).running() as server:
        m = mount(server.url)
        assert (m.path / SCALE / name).read_bytes() == (twin / SCALE / name).read_bytes()
        replaced = copy / SCALE / f"0.{half}"
        if half == "data":  # the chunk's bytes inverted: its old index finds other bytes there
            replace(replaced, twin / SCALE / name, grow=False)
        else:  # the same bytes in a new object: only its version says it is another
            fresh = replaced.with_name("fresh")
            fresh.write_bytes(replaced.read_bytes())
            when = int(replaced.stat().st_mtime) + 10
            os.utime(fresh, (when, when))
            os.replace(fresh, replaced)
        forget_pages(m.path / SCALE / name)
        got = {n: read_errno(m.path / SCALE / n) or (m.path / SCALE / n).read_bytes() for n in [name, *others]}
    assert all(got[n] in (errno.EIO, (twin / SCALE / n).read_bytes()) for n in got), "only EIO or the right bytes"
    if half == "index":
        assert errno.EIO not in got.values() and "changed under the mount" not in m.log_text()
        return
    assert got[name] == errno.EIO
    assert "changed under the mount" in m.log_text() and f"{SCALE}/0.{half}" in m.log_text()


def test_each_half_is_shown_as_only_those_who_may_read_both_see_it(volume, public_tmp, mount, user) -> None:
    """A chunk's name comes from the `.index` and its bytes from the `.data`: another user reads the chunks of a
    pair only if both halves let them."""
    source, split_source, _, _ = volume
    shared = public_tmp / "vol"
    shutil.copytree(split_source, shared)
    (shared / SCALE / "0.index").chmod(0o600)
    (shared / SCALE / "1.data").chmod(0o600)
    m = mount(shared, "-o", "allow_other", under=public_tmp)
    for stem, readable in (("0", False), ("1", False), ("2", True)):
        for name in chunks_in(source, stem)[:3]:
            result = as_user(user, "cat", m.path / SCALE / name)
            assert (result.returncode == 0) is readable and (readable or denied(result)), (stem, name)
            assert (m.path / SCALE / name).read_bytes()  # root reads it


# ---------------------------------------------------------------------------------------------------------------------
# Broken pairs: EIO for their keys alone, named in the log and by `shardfs check`


def broken(split_source: Path, tmp_path: Path) -> Path:
    """The split volume with shard 0's `.data` gone, shard 1's `.index` gone, and shard 2 split 16 bytes too
    early (its concatenation still the right `.shard`); shard 3 intact."""
    bad = tmp_path / "bad"
    shutil.copytree(split_source, bad)
    scale = bad / SCALE
    (scale / "0.data").unlink()
    (scale / "1.index").unlink()
    index, data = (scale / "2.index").read_bytes(), (scale / "2.data").read_bytes()
    (scale / "2.index").write_bytes(index[:-16])
    (scale / "2.data").write_bytes(index[-16:] + data)
    return bad


def test_a_broken_pair_is_eio_for_its_keys_and_logged(volume, tmp_path, mount) -> None:
    source, split_source, twin, _ = volume
    m = mount(broken(split_source, tmp_path))
    for stem in ("0", "1", "2"):
        names = chunks_in(source, stem)
        assert names
        for name in names:
            assert_eio(m.path / SCALE / name)
    intact = chunks_in(source, "3")
    assert intact and all((m.path / SCALE / n).read_bytes() == (twin / SCALE / n).read_bytes() for n in intact)
    assert sorted(os.listdir(m.path / SCALE)) == intact  # the broken shards are skipped, and logged
    log = m.log_text()
    assert f"{SCALE}/0.data is missing" in log
    assert f"{SCALE}/1.index is missing" in log
    index_size = 16 << VOLUME_MINISHARD_BITS
    assert f"{SCALE}/2.index is {index_size - 16} bytes, not the {index_size}-byte shard index" in log


def test_check(volume, tmp_path) -> None:
    """On a sound split source, `check` says what it says of the `.shard` source; on a broken one it names each
    broken pair and what is wrong with it."""
    source, split_source, _, _ = volume
    sound = shardfs("check", split_source, check=False)
    assert sound.returncode == 0 and sound.stdout.splitlines()[-1].startswith("OK: ")
    assert sound.stdout == shardfs("check", source).stdout

    bad = shardfs("check", broken(split_source, tmp_path), check=False)
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    assert lines[0].endswith(", 3 corrupt") and lines[-1].startswith("CORRUPT: ")
    assert f"  {SCALE}/0.index+0.data: {SCALE}/0.data is missing, and the other half is there" in lines
    assert f"  {SCALE}/1.index+1.data: {SCALE}/1.index is missing, and the other half is there" in lines
    assert any(line.startswith(f"  {SCALE}/2.index+2.data: {SCALE}/2.index is ") for line in lines)
