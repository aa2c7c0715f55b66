"""Many readers at once through the multithreaded daemon, with a cache far smaller than the data so that
evictions race with lookups: every byte must still be the unsharded dataset's."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zarr

from tests import peers


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

    array_root = tmp_path / "a.zarr"
    array = zarr.create_array(array_root, shape=(64, 64), chunks=(4, 4), shards=(16, 16), dtype="uint16")
    array[...] = np.arange(64 * 64, dtype="uint16").reshape(64, 64)
    m = mount(array_root, "--cache-size", "64K")
    names = [f"c/{i}/{j}" for i in range(16) for j in range(16)]
    got = read_all_concurrently(m.path, names)
    back = zarr.open_array(m.path, mode="r")
    assert np.array_equal(back[...], array[...])
    assert len(got) == 256 and all(len(v) > 0 for v in got.values())
    assert {n: got[n] for n in names} == {n: (m.path / n).read_bytes() for n in names}
