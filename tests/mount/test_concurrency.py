"""Many readers at once through the multithreaded daemon, with a cache far smaller than the data so that
evictions race with lookups: every byte must still be the unsharded dataset's."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.support import peers

pytestmark = [pytest.mark.kernel]


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def read_all_concurrently(root: Path, names: list[str], threads: int = 16) -> dict[str, bytes]:
    order = names * 3
    random.Random(0).shuffle(order)
    with ThreadPoolExecutor(threads) as pool:
        return dict(zip(order, pool.map(lambda n: (root / n).read_bytes(), order), strict=True))


def test_concurrent_readers_with_a_tiny_cache(tmp_path, mount) -> None:
    volume, twin = tmp_path / "vol", tmp_path / "twin"
    peers.write_tensorstore_volume(volume, unsharded_twin=twin, extra_unsharded_scale=False)
    expected = files_under(twin / "4_4_40")
    m = mount(volume, "--cache-size", "64K")  # smaller than the decoded chunks: constant eviction
    assert read_all_concurrently(m.path / "4_4_40", sorted(expected)) == expected

    array_root, twin_root = tmp_path / "a.zarr", tmp_path / "twin.zarr"
    data = np.random.default_rng(0).integers(0, 60000, (64, 64), dtype="uint16")
    array = zarr.create_array(array_root, shape=(64, 64), chunks=(4, 4), shards=(16, 16), dtype="uint16")
    array[...] = data
    twin = zarr.create_array(twin_root, shape=(64, 64), chunks=(4, 4), dtype="uint16")  # the same codecs, unsharded
    twin[...] = data
    expected = {n: b for n, b in files_under(twin_root).items() if n != "zarr.json"}
    assert len(expected) == 256
    m = mount(array_root, "--cache-size", "64K")
    assert read_all_concurrently(m.path, sorted(expected)) == expected
    assert np.array_equal(zarr.open_array(m.path, mode="r")[...], data)
